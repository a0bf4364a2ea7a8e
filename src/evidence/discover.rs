//! Where redis's log is: named with `--redis-log`, found beside an offline trace or through
//! a redis config, or, live, the config's `logfile` or what `CONFIG GET logfile` answers.
//! One job: name the file and say how it was found; reading it is the join's.

use crate::report::{FileClass, LogFound, Report};

/// Where the log to read is, and how it was found.
#[derive(Clone, Debug)]
pub struct LogSource {
    pub path: String,
    pub found: LogFound,
    /// The user named it (`--redis-log`): failing to read it is an error, not a note.
    pub explicit: bool,
}

/// Live: the log to follow is `--redis-log`, else the config's `logfile` (relative to the
/// process's working directory, which redis has changed to its `dir`), else what redis at
/// `--redis` says its logfile is.
pub fn live_log_source(
    explicit: Option<&str>,
    redis: Option<&str>,
    ctx: &crate::live::procctx::ProcContext,
    conf: Option<&crate::fdtable::RedisConf>,
) -> Option<LogSource> {
    let src = match explicit {
        Some(p) => Some(LogSource {
            path: p.to_string(),
            found: LogFound::Flag,
            explicit: true,
        }),
        None => conf
            .and_then(|c| c.logfile.as_deref())
            .filter(|l| !l.is_empty())
            .map(|l| LogSource {
                path: host_path(ctx, l),
                found: LogFound::ConfLogfile,
                explicit: false,
            }),
    };
    // redis rewrites its argv, so /proc may not tell the config; redis itself can.
    src.or_else(|| {
        let addr = redis?;
        let wait = std::time::Duration::from_secs(2);
        let mut c = crate::redis_client::Conn::connect_near(addr, wait, Some(ctx.pid)).ok()?;
        let r = c.cmd(&["CONFIG", "GET", "logfile"]).ok()?;
        let lf = r.items().get(1)?.as_text().filter(|l| !l.is_empty())?;
        Some(LogSource {
            path: host_path(ctx, &lf),
            found: LogFound::ConfigGet,
            explicit: false,
        })
    })
}

/// Where the host reads a file the process names `p` (relative to its working directory,
/// which redis has changed to its `dir`): through /proc/PID/root in a container.
fn host_path(ctx: &crate::live::procctx::ProcContext, p: &str) -> String {
    let path = std::path::Path::new(p);
    let full = match (&ctx.cwd, path.is_absolute()) {
        (Some(cwd), false) => std::path::Path::new(cwd).join(path),
        _ => path.to_path_buf(),
    };
    ctx.root.host_path(&full.to_string_lossy())
}

/// Which log to follow, found before the tracer attaches (`attach --redis`, `watch`): once
/// traced, the one-off `CONFIG GET logfile` connection's command would count as a client's.
/// `conf` is the user's config; without it, the one the process was started with.
pub fn log_source_before_attach(
    pid: u32,
    explicit: Option<&str>,
    redis: Option<&str>,
    conf: Option<&crate::fdtable::RedisConf>,
) -> Option<LogSource> {
    let pre = crate::live::procctx::gather(pid);
    let pre_conf =
        (!pre.redis_conf.is_empty()).then(|| crate::fdtable::RedisConf::parse(&pre.redis_conf));
    live_log_source(explicit, redis, &pre, conf.or(pre_conf.as_ref()))
}

/// A recording's own copy of redis's log lines (`attach --record`), beside the trace at
/// `FILE` as `FILE.redis.log`.
pub const RECORDED_LOG_SUFFIX: &str = ".redis.log";

/// Finds redis's log for an offline trace without being told: beside the trace (a
/// recording's `FILE.redis.log`, then `NAME.redis.log`, `redis.log`, gzipped or not), the
/// file a redis.conf names (given with
/// --redis-conf, or `NAME.redis.conf` beside the trace), or the log file the trace itself
/// wrote, when it exists here.
pub fn find_log(
    trace_files: &[String],
    conf: Option<&crate::fdtable::RedisConf>,
    report: &Report,
) -> Option<LogSource> {
    let exists = |p: &std::path::Path| p.is_file();
    let found = |p: std::path::PathBuf, how: LogFound| LogSource {
        path: p.to_string_lossy().into_owned(),
        found: how,
        explicit: false,
    };
    let trace = trace_files.iter().find(|f| f.as_str() != "-");
    let mut side_conf = None;
    if let Some(t) = trace {
        let p = std::path::Path::new(t);
        let dir = p.parent().unwrap_or(std::path::Path::new("")).to_path_buf();
        let name = p.file_name()?.to_string_lossy().into_owned();
        let recorded = dir.join(format!("{name}{RECORDED_LOG_SUFFIX}"));
        if exists(&recorded) {
            return Some(found(recorded, LogFound::BesideTrace));
        }
        let mut stem = name.trim_end_matches(".gz").to_string();
        // An `strace -ff` piece: NAME.PID.
        if let Some((head, tail)) = stem.rsplit_once('.') {
            if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
                stem = head.to_string();
            }
        }
        for ext in [".strace", ".txt", ".trace", ".log", ".perf"] {
            if let Some(s) = stem.strip_suffix(ext) {
                stem = s.to_string();
                break;
            }
        }
        for cand in [
            format!("{stem}.redis.log"),
            format!("{stem}.redis.log.gz"),
            "redis.log".to_string(),
            "redis.log.gz".to_string(),
        ] {
            let c = dir.join(&cand);
            if exists(&c) {
                return Some(found(c, LogFound::BesideTrace));
            }
        }
        let c = dir.join(format!("{stem}.redis.conf"));
        if let Ok(text) = std::fs::read_to_string(&c) {
            side_conf = Some((crate::fdtable::RedisConf::parse(&text), dir));
        }
    }
    let trace_dir = trace
        .and_then(|t| std::path::Path::new(t).parent())
        .map(|d| d.to_path_buf())
        .unwrap_or_default();
    let confs = conf
        .map(|c| (c.clone(), trace_dir.clone()))
        .into_iter()
        .chain(side_conf);
    for (c, here) in confs {
        let Some(lf) = c.logfile.as_deref().filter(|l| !l.is_empty()) else {
            continue;
        };
        let lp = std::path::Path::new(lf);
        let mut cands = vec![];
        if lp.is_absolute() {
            cands.push(lp.to_path_buf());
            // A capture moved off its machine: the same name beside the trace.
            if let Some(n) = lp.file_name() {
                cands.push(here.join(n));
            }
        } else {
            if let Some(d) = &c.dir {
                cands.push(std::path::Path::new(d).join(lp));
            }
            cands.push(here.join(lp));
        }
        if let Some(p) = cands.into_iter().find(|p| exists(p)) {
            return Some(found(p, LogFound::ConfLogfile));
        }
    }
    trace_log_file(report, &crate::live::container::Root::host())
}

/// The log file the trace saw redis write, when the host can read it: through `root`
/// (a container's paths are under /proc/PID/root on the host).
pub fn trace_log_file(report: &Report, root: &crate::live::container::Root) -> Option<LogSource> {
    report
        .fds
        .iter()
        .filter(|f| f.class == FileClass::Log)
        .filter_map(|f| f.path.as_deref())
        .map(|p| root.host_path(p))
        .find(|p| std::path::Path::new(p).is_file())
        .map(|p| LogSource {
            path: p,
            found: LogFound::TraceLogFile,
            explicit: false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `attach --record FILE` keeps redis's log lines as `FILE.redis.log` (a container's log
    /// is gone with it): `analyze FILE` finds them without `--redis-log`, before a log that
    /// merely shares the trace's stem.
    #[test]
    fn a_recordings_own_log_is_found_beside_it_first() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("c.strace");
        std::fs::write(&trace, "").unwrap();
        let files = vec![trace.to_string_lossy().into_owned()];
        let report = Report::default();
        assert!(find_log(&files, None, &report).is_none());
        let stem_log = dir.path().join("c.redis.log");
        std::fs::write(&stem_log, "").unwrap();
        let got = find_log(&files, None, &report).expect("found");
        assert_eq!(got.path, stem_log.to_string_lossy());
        let own = dir.path().join(format!("c.strace{RECORDED_LOG_SUFFIX}"));
        std::fs::write(&own, "").unwrap();
        let got = find_log(&files, None, &report).expect("found");
        assert_eq!(got.path, own.to_string_lossy());
        assert_eq!(got.found, LogFound::BesideTrace);
        assert!(!got.explicit);
    }
}
