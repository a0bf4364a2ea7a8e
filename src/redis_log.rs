//! redis's own log file, read: the first input of the redis-evidence join (`redis_evidence`),
//! beside the trace. One job: turn the lines of a redis or valkey log (plain or gzip) into
//! timestamped records, whatever format wrote them. The formats are redis's own:
//!
//! * redis 3+: `PID:ROLE DD Mon YYYY HH:MM:SS.mmm LEVEL message` (ROLE X sentinel, C child,
//!   S replica, M master; LEVEL `.` debug, `-` verbose, `*` notice, `#` warning);
//! * redis 2.x: `[PID] DD Mon HH:MM:SS[.mmm] LEVEL message`, with no year;
//! * the signal handler's `PID:signal-handler (EPOCH) message`, in epoch seconds;
//! * valkey's `log-timestamp-format iso8601` (`2026-11-30T22:55:12.655+00:00`) and
//!   `milliseconds` (epoch ms) in the same legacy layout, and `log-format logfmt`:
//!   `pid=N role=R timestamp="..." level=L message="..."`.
//!
//! redis prints its wall clock in the machine's local time without saying which zone, so a
//! timestamp is kept as it was printed (`LogTime::Local`) unless the line itself carries an
//! offset or an epoch; the join decides the zone and says what it assumed.

pub use crate::report::{LogLevel, LogRole};
use anyhow::{Context, Result};
use chrono::NaiveDateTime;
use regex::Regex;
use std::io::{BufRead, Read};
use std::sync::OnceLock;

/// A log line's time, as precise as the line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogTime {
    /// Local wall-clock time of an unknown zone. `year_known` is false for redis 2.x lines,
    /// whose year was left out (the year in `t` is then a placeholder to be replaced).
    Local { t: NaiveDateTime, year_known: bool },
    /// Milliseconds since the epoch (UTC), from a line that carries its offset or an epoch.
    Epoch { ms: i64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// 1-based line number in the file.
    pub line: u64,
    pub pid: Option<u32>,
    pub role: LogRole,
    /// None for signal-handler lines.
    pub level: Option<LogLevel>,
    pub time: LogTime,
    /// How many ms the timestamp may lag the event: 1 for ms stamps, 1000 for seconds.
    pub resolution_ms: i64,
    pub message: String,
}

/// Which layout a line was written in, for the report's `redis.log.formats`.
pub use crate::report::LogFormat;

struct Patterns {
    legacy: Regex,
    redis2: Regex,
    signal: Regex,
    logfmt: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| Patterns {
        // The timestamp group is whatever valkey's log-timestamp-format printed; it is told
        // apart after the match.
        legacy: Regex::new(
            r"^(\d+):([XCSM]) (\d{1,2} [A-Za-z]{3} \d{4} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:?\d{2})?|\d{12,14}) ([.*#-]) (.*)$",
        )
        .expect("legacy log regex"),
        redis2: Regex::new(
            r"^\[(\d+)\] (\d{1,2} [A-Za-z]{3} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?) ([.*#-]) (.*)$",
        )
        .expect("redis 2 log regex"),
        signal: Regex::new(r"^(\d+):signal-handler \((\d+)\) (.*)$").expect("signal regex"),
        logfmt: Regex::new(
            r#"^pid=(\d+) role=(\S+) timestamp="([^"]*)" level=(\w+) message="(.*)"$"#,
        )
        .expect("logfmt regex"),
    })
}

fn level_char(c: &str) -> Option<LogLevel> {
    Some(match c {
        "." => LogLevel::Debug,
        "-" => LogLevel::Verbose,
        "*" => LogLevel::Notice,
        "#" => LogLevel::Warning,
        _ => return None,
    })
}

fn level_word(w: &str) -> Option<LogLevel> {
    Some(match w {
        "debug" => LogLevel::Debug,
        "verbose" | "info" => LogLevel::Verbose,
        "notice" => LogLevel::Notice,
        "warning" => LogLevel::Warning,
        _ => return None,
    })
}

fn role_char(c: &str) -> LogRole {
    match c {
        "X" => LogRole::Sentinel,
        "C" => LogRole::Child,
        "S" => LogRole::Replica,
        _ => LogRole::Master,
    }
}

/// A leap year for redis 2.x stamps, so that 29 Feb parses before the real year is known.
const PLACEHOLDER_YEAR: i32 = 2000;

/// Parses one timestamp in any of the forms redis and valkey print; `Err` names what failed.
fn parse_time(s: &str) -> Option<(LogTime, i64, LogFormat)> {
    let s = s.trim();
    if s.len() >= 12 && s.bytes().all(|b| b.is_ascii_digit()) {
        return Some((
            LogTime::Epoch {
                ms: s.parse().ok()?,
            },
            1,
            LogFormat::ValkeyMillis,
        ));
    }
    if s.as_bytes().get(4) == Some(&b'-') {
        // ISO 8601, with or without an offset.
        if let Ok(t) = chrono::DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f%:z")
            .or_else(|_| chrono::DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f%z"))
        {
            return Some((
                LogTime::Epoch {
                    ms: t.timestamp_millis(),
                },
                1,
                LogFormat::ValkeyIso,
            ));
        }
        if let Some(z) = s.strip_suffix('Z') {
            let t = NaiveDateTime::parse_from_str(z, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
            return Some((
                LogTime::Epoch {
                    ms: t.and_utc().timestamp_millis(),
                },
                1,
                LogFormat::ValkeyIso,
            ));
        }
        let t = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
        return Some((
            LogTime::Local {
                t,
                year_known: true,
            },
            1,
            LogFormat::ValkeyIso,
        ));
    }
    let res = if s.contains('.') { 1 } else { 1000 };
    if let Ok(t) = NaiveDateTime::parse_from_str(s, "%d %b %Y %H:%M:%S%.f") {
        return Some((
            LogTime::Local {
                t,
                year_known: true,
            },
            res,
            LogFormat::Redis3,
        ));
    }
    // No year (redis 2.x): parse it in a leap year; the join puts the right year in.
    let t =
        NaiveDateTime::parse_from_str(&format!("{s} {PLACEHOLDER_YEAR}"), "%d %b %H:%M:%S%.f %Y")
            .ok()?;
    Some((
        LogTime::Local {
            t,
            year_known: false,
        },
        res,
        LogFormat::Redis2,
    ))
}

/// One line of a redis log, or None when it is not a log record (the ASCII-art banner of
/// redis 3-6, a crash report's free text, a blank line).
pub fn parse_line(text: &str, line: u64) -> Option<(LogLine, LogFormat)> {
    let p = patterns();
    let text = text.trim_end_matches(['\r', '\n']);
    if let Some(c) = p.legacy.captures(text) {
        let (time, resolution_ms, fmt) = parse_time(&c[3])?;
        return Some((
            LogLine {
                line,
                pid: c[1].parse().ok(),
                role: role_char(&c[2]),
                level: level_char(&c[4]),
                time,
                resolution_ms,
                message: c[5].to_string(),
            },
            fmt,
        ));
    }
    if let Some(c) = p.signal.captures(text) {
        let secs: i64 = c[2].parse().ok()?;
        return Some((
            LogLine {
                line,
                pid: c[1].parse().ok(),
                role: LogRole::SignalHandler,
                level: None,
                time: LogTime::Epoch { ms: secs * 1000 },
                resolution_ms: 1000,
                message: c[3].to_string(),
            },
            LogFormat::SignalHandler,
        ));
    }
    if let Some(c) = p.logfmt.captures(text) {
        let (time, resolution_ms, _) = parse_time(&c[3])?;
        return Some((
            LogLine {
                line,
                pid: c[1].parse().ok(),
                role: match &c[2] {
                    "master" | "primary" => LogRole::Master,
                    "replica" | "slave" => LogRole::Replica,
                    "sentinel" => LogRole::Sentinel,
                    r if r.contains("RDB") || r.contains("AOF") || r == "child" => LogRole::Child,
                    r => LogRole::Other(r.into()),
                },
                level: level_word(&c[4]),
                time,
                resolution_ms,
                message: c[5].replace("\\\"", "\""),
            },
            LogFormat::Logfmt,
        ));
    }
    if let Some(c) = p.redis2.captures(text) {
        let (time, resolution_ms, fmt) = parse_time(&c[2])?;
        return Some((
            LogLine {
                line,
                pid: c[1].parse().ok(),
                role: LogRole::Master,
                level: level_char(&c[3]),
                time,
                resolution_ms,
                message: c[4].to_string(),
            },
            fmt,
        ));
    }
    None
}

/// What reading a log file found, besides its lines.
#[derive(Clone, Debug, Default)]
pub struct ReadStats {
    pub lines: u64,
    /// Lines that are not log records (banner art, crash-report text).
    pub unparsed: u64,
    /// Every layout seen, most lines first.
    pub formats: Vec<(LogFormat, u64)>,
    /// The file's first and last records, kept or not.
    pub first: Option<LogLine>,
    pub last: Option<LogLine>,
}

/// Opens a log file, plain or gzip (told by its magic bytes, not its name).
pub fn open(path: &str) -> Result<Box<dyn BufRead + Send>> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot open {path}"))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic)?;
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {path}"))?;
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(std::io::BufReader::new(
            flate2::read::MultiGzDecoder::new(f),
        )))
    } else {
        Ok(Box::new(std::io::BufReader::new(f)))
    }
}

/// Reads every record of `r`, handing each to `keep` (which decides what is held in
/// memory: a day of verbose logging is millions of lines, of which a trace needs seconds).
pub fn read(r: impl BufRead, mut keep: impl FnMut(LogLine)) -> Result<ReadStats> {
    let mut st = ReadStats::default();
    let mut counts: std::collections::BTreeMap<LogFormat, u64> = Default::default();
    let mut buf = Vec::new();
    let mut r = r;
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        st.lines += 1;
        let text = String::from_utf8_lossy(&buf);
        match parse_line(&text, st.lines) {
            Some((l, fmt)) => {
                *counts.entry(fmt).or_default() += 1;
                if st.first.is_none() {
                    st.first = Some(l.clone());
                }
                st.last = Some(l.clone());
                keep(l);
            }
            None => {
                if !text.trim().is_empty() {
                    st.unparsed += 1;
                }
            }
        }
    }
    st.formats = counts.into_iter().collect();
    st.formats.sort_by_key(|f| std::cmp::Reverse(f.1));
    Ok(st)
}

/// Most lines a follower keeps: hours of verbose logging would otherwise grow without bound.
pub const FOLLOW_MAX_LINES: usize = 200_000;

/// Live: reads a log file's new lines as redis writes them, from where the file ended when
/// following began, rotations and truncations included.
///
/// The file is read by a `tail -F` child process, never by stallscope itself: the log is
/// often on the very disk that is stalling redis, and there every close() of the file can
/// block for seconds (a FUSE or NFS flush waits uninterruptibly). A thread stuck there would
/// keep stallscope from exiting; a helper process stuck there is simply left behind, and
/// tracing, detaching and reporting go on.
pub struct Follower {
    child: Option<std::process::Child>,
    shared: std::sync::Arc<std::sync::Mutex<Followed>>,
}

#[derive(Debug, Default, Clone)]
pub struct Followed {
    pub lines: Vec<LogLine>,
    pub stats: ReadStats,
    pub dropped: u64,
    pub error: Option<String>,
    /// The helper's output ended (a whole-file read is complete).
    pub done: bool,
    /// The lines read, as redis wrote them (parsed or not), when the follower was asked to
    /// keep them (`attach --record` keeps them beside the recording); as many lines as
    /// `lines` may hold.
    pub text: Vec<u8>,
}

impl Follower {
    /// `keep_text`: keep the lines' text too (`Followed::text`).
    pub fn start(path: &str, every: std::time::Duration, keep_text: bool) -> Follower {
        // Where the file ends now: lines before that were written before tracing.
        let from = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Self::spawn(path, from, Some(every), keep_text)
    }

    /// The whole file as it is now, read by the same kind of helper (`tail -c +1`), for a
    /// live trace that learnt the log's path only from the fd table at the end.
    pub fn read_whole(path: &str, keep_text: bool) -> Follower {
        Self::spawn(path, 0, None, keep_text)
    }

    fn spawn(
        path: &str,
        from: u64,
        follow: Option<std::time::Duration>,
        keep_text: bool,
    ) -> Follower {
        let shared = std::sync::Arc::new(std::sync::Mutex::new(Followed::default()));
        let mut cmd = std::process::Command::new("tail");
        if let Some(every) = follow {
            cmd.arg("-F")
                .arg("-s")
                .arg(format!("{:.2}", every.as_secs_f64()));
        }
        let child = cmd
            .arg("-c")
            .arg(format!("+{}", from + 1))
            .arg("--")
            .arg(path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                shared.lock().unwrap_or_else(|p| p.into_inner()).error =
                    Some(format!("cannot start tail -F to follow it: {e}"));
                return Follower {
                    child: None,
                    shared,
                };
            }
        };
        let out = child.stdout.take();
        let sh = shared.clone();
        let _ = std::thread::Builder::new()
            .name("redis-log".into())
            .spawn(move || {
                let Some(out) = out else { return };
                let mut r = std::io::BufReader::new(out);
                let mut buf = vec![];
                let mut counts: std::collections::BTreeMap<LogFormat, u64> = Default::default();
                loop {
                    buf.clear();
                    let end = matches!(r.read_until(b'\n', &mut buf), Ok(0) | Err(_));
                    // A line still being written when tail stopped has no newline yet.
                    if end || buf.last() != Some(&b'\n') {
                        sh.lock().unwrap_or_else(|p| p.into_inner()).done = true;
                        break;
                    }
                    let mut f = sh.lock().unwrap_or_else(|p| p.into_inner());
                    f.stats.lines += 1;
                    let n = f.stats.lines;
                    if keep_text && n as usize <= FOLLOW_MAX_LINES {
                        f.text.extend_from_slice(&buf);
                    }
                    match parse_line(&String::from_utf8_lossy(&buf), n) {
                        Some((line, fmt)) => {
                            *counts.entry(fmt).or_default() += 1;
                            f.stats.formats = counts.iter().map(|(k, v)| (*k, *v)).collect();
                            f.stats.formats.sort_by_key(|x| std::cmp::Reverse(x.1));
                            if f.lines.len() < FOLLOW_MAX_LINES {
                                f.lines.push(line);
                            } else {
                                f.dropped += 1;
                            }
                        }
                        None => f.stats.unparsed += 1,
                    }
                }
            });
        Follower {
            child: Some(child),
            shared,
        }
    }

    /// How many records have been read so far (its tests wait on it).
    #[cfg(test)]
    fn records(&self) -> usize {
        self.shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines
            .len()
    }

    /// `watch`: the lines read since the last call (moved out, so that a follower running
    /// for days holds only what came since), with the counts so far.
    pub fn take_lines(&self) -> Followed {
        let mut f = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        Followed {
            lines: std::mem::take(&mut f.lines),
            stats: f.stats.clone(),
            dropped: f.dropped,
            error: f.error.clone(),
            done: f.done,
            text: std::mem::take(&mut f.text),
        }
    }

    /// Gives tail a moment to pass on the last lines, stops it, and returns every line read.
    /// Never waits on the file itself (see the type's comment).
    pub fn finish(mut self, grace: std::time::Duration) -> Followed {
        let t = std::time::Instant::now();
        while t.elapsed() < grace && !self.shared.lock().unwrap_or_else(|p| p.into_inner()).done {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            // Reaped if it is already gone; if it is stuck on the disk, left behind.
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_millis(200) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        self.shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> (LogLine, LogFormat) {
        parse_line(s, 1).unwrap_or_else(|| panic!("not parsed: {s}"))
    }

    fn local(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap()
    }

    #[test]
    fn roles_and_levels_serialize_as_the_words_they_were() {
        fn json<T: serde::Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap()
        }
        for (r, w) in [
            (LogRole::Master, "master"),
            (LogRole::Replica, "replica"),
            (LogRole::Child, "child"),
            (LogRole::Sentinel, "sentinel"),
            (LogRole::SignalHandler, "signal-handler"),
            (LogRole::Other("module".into()), "module"),
        ] {
            assert_eq!(json(&r), format!("\"{w}\""));
        }
        for l in [
            LogLevel::Debug,
            LogLevel::Verbose,
            LogLevel::Notice,
            LogLevel::Warning,
        ] {
            assert_eq!(json(&Some(l)), format!("\"{}\"", l.as_str()));
        }
        assert_eq!(json(&None::<LogLevel>), "null");
    }

    #[test]
    fn redis3_lines() {
        let (l, f) = one("27995:M 30 Nov 2026 22:55:12.655 - Accepted 127.0.0.1:47826");
        assert_eq!(f, LogFormat::Redis3);
        assert_eq!(l.pid, Some(27995));
        assert_eq!(l.role.as_str(), "master");
        assert_eq!(l.level.map(LogLevel::as_str), Some("verbose"));
        assert_eq!(l.resolution_ms, 1);
        assert_eq!(
            l.time,
            LogTime::Local {
                t: local("2026-11-30 22:55:12.655"),
                year_known: true
            }
        );
        assert_eq!(l.message, "Accepted 127.0.0.1:47826");
        let (l, _) = one("28169:C 30 Nov 2026 22:55:25.900 * DB saved on disk");
        assert_eq!(
            (l.role.as_str(), l.level.map(LogLevel::as_str)),
            ("child", Some("notice"))
        );
        let (l, _) = one("11461:M 30 Nov 2026 22:41:21.935 # User requested shutdown...");
        assert_eq!(l.level.map(LogLevel::as_str), Some("warning"));
        // redis 3.0 printed no milliseconds on some builds: one-second resolution.
        let (l, _) = one("1:S 01 Jan 2015 00:00:01 . debug line");
        assert_eq!(
            (
                l.role.as_str(),
                l.level.map(LogLevel::as_str),
                l.resolution_ms
            ),
            ("replica", Some("debug"), 1000)
        );
    }

    #[test]
    fn redis2_lines_have_no_year() {
        let (l, f) = one("[4242] 07 Mar 10:11:12.345 # Asynchronous AOF fsync is taking too long (disk is busy?). Writing the AOF buffer without waiting for fsync to complete, this may slow down Redis.");
        assert_eq!(f, LogFormat::Redis2);
        assert_eq!(l.pid, Some(4242));
        assert_eq!(l.level.map(LogLevel::as_str), Some("warning"));
        let LogTime::Local { t, year_known } = l.time else {
            panic!("{:?}", l.time)
        };
        assert!(!year_known);
        assert_eq!(
            t.format("%m-%d %H:%M:%S%.3f").to_string(),
            "03-07 10:11:12.345"
        );
        // Without milliseconds, and on 29 February (parsed in a leap placeholder year).
        let (l, _) = one("[7] 29 Feb 23:59:59 * DB saved on disk");
        assert_eq!(l.resolution_ms, 1000);
        assert!(matches!(
            l.time,
            LogTime::Local {
                year_known: false,
                ..
            }
        ));
    }

    #[test]
    fn signal_handler_lines_are_epoch_seconds() {
        let (l, f) =
            one("27995:signal-handler (1796079330) Received SIGTERM scheduling shutdown...");
        assert_eq!(f, LogFormat::SignalHandler);
        assert_eq!(
            l.time,
            LogTime::Epoch {
                ms: 1_796_079_330_000
            }
        );
        assert_eq!(l.resolution_ms, 1000);
        assert_eq!(l.level.map(LogLevel::as_str), None);
    }

    #[test]
    fn valkey_iso8601_and_millisecond_stamps() {
        let (l, f) =
            one("77:M 2026-11-30T23:55:12.655+01:00 * Background saving started by pid 78");
        assert_eq!(f, LogFormat::ValkeyIso);
        // 23:55 at +01:00 is 22:55 UTC.
        let utc = local("2026-11-30 22:55:12.655")
            .and_utc()
            .timestamp_millis();
        assert_eq!(l.time, LogTime::Epoch { ms: utc });
        let (l, _) = one("77:M 2026-11-30T22:55:12.655Z * x");
        assert_eq!(l.time, LogTime::Epoch { ms: utc });
        let (l, _) = one("77:M 2026-11-30T22:55:12.655+0000 * x");
        assert_eq!(l.time, LogTime::Epoch { ms: utc });
        let (l, f) = one(&format!(
            "77:C {utc} - Fork CoW for RDB: current 1 MB, peak 1 MB, average 1 MB"
        ));
        assert_eq!(f, LogFormat::ValkeyMillis);
        assert_eq!(
            (l.time, l.role.as_str()),
            (LogTime::Epoch { ms: utc }, "child")
        );
    }

    #[test]
    fn valkey_logfmt_lines() {
        let (l, f) = one(
            r#"pid=77 role=master timestamp="2026-11-30T22:55:12.655+00:00" level=warning message="Asynchronous AOF fsync is taking too long (disk is busy?). Writing the AOF buffer without waiting for fsync to complete, this may slow down the server.""#,
        );
        assert_eq!(f, LogFormat::Logfmt);
        assert_eq!(l.pid, Some(77));
        assert_eq!(l.role.as_str(), "master");
        assert_eq!(l.level.map(LogLevel::as_str), Some("warning"));
        assert!(l
            .message
            .starts_with("Asynchronous AOF fsync is taking too long"));
        let utc = local("2026-11-30 22:55:12.655")
            .and_utc()
            .timestamp_millis();
        assert_eq!(l.time, LogTime::Epoch { ms: utc });
        // The child's role is valkey's "RDB/AOF"; a legacy-style stamp inside logfmt.
        let (l, _) = one(
            r#"pid=78 role=RDB/AOF timestamp="30 Nov 2026 22:55:25.900" level=notice message="DB saved on disk""#,
        );
        assert_eq!(l.role.as_str(), "child");
        assert!(matches!(
            l.time,
            LogTime::Local {
                year_known: true,
                ..
            }
        ));
    }

    #[test]
    fn banner_and_free_text_are_not_records() {
        for s in [
            "                _._                                                  ",
            "           _.-``__ ''-._                                             ",
            "------ STACK TRACE ------",
            "",
            "27995:M 30 Nov 2026 25:55:12.655 - an impossible hour",
        ] {
            assert!(parse_line(s, 1).is_none(), "{s:?}");
        }
        let text = "x\n27995:M 30 Nov 2026 22:55:12.655 - a\n\n 9:C 30 Nov 2026 22:55:12.655 * b\n";
        let mut got = vec![];
        let st = read(text.as_bytes(), |l| got.push(l.line)).unwrap();
        assert_eq!(got, vec![2]);
        assert_eq!((st.lines, st.unparsed), (4, 2));
        assert_eq!(st.formats, vec![(LogFormat::Redis3, 1)]);
    }

    #[test]
    fn gzip_is_told_by_its_magic() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("redis.log");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&p).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(b"1:M 30 Nov 2026 22:55:12.655 * Ready to accept connections\n")
            .unwrap();
        gz.finish().unwrap();
        let mut n = 0;
        read(open(p.to_str().unwrap()).unwrap(), |_| n += 1).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_follower_reads_only_new_lines_and_survives_rotation() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("redis.log");
        let ps = p.to_str().unwrap();
        std::fs::write(&p, "1:M 30 Nov 2026 22:55:00.000 * before following\n").unwrap();
        let f = Follower::start(ps, std::time::Duration::from_millis(20), true);
        let mut w = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        w.write_all(b"1:M 30 Nov 2026 22:55:01.000 * first\n1:M 30 Nov 2026 22:55:0")
            .unwrap();
        w.flush().unwrap();
        let wait_for = |n: usize| {
            let t = std::time::Instant::now();
            while f.records() < n && t.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert_eq!(f.records(), n, "tail -F passed on {} records", f.records());
        };
        wait_for(1);
        w.write_all(b"2.000 * second, written in two pieces\n")
            .unwrap();
        drop(w);
        wait_for(2);
        // Rotated: renamed away, and redis's next line creates a new file.
        std::fs::rename(&p, dir.path().join("redis.log.1")).unwrap();
        std::fs::write(
            &p,
            "1:M 30 Nov 2026 22:55:03.000 # third, in the new file\n",
        )
        .unwrap();
        wait_for(3);
        let got = f.finish(std::time::Duration::from_millis(300));
        let msgs: Vec<&str> = got.lines.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(
            msgs,
            vec![
                "first",
                "second, written in two pieces",
                "third, in the new file"
            ]
        );
        assert!(got.error.is_none(), "{:?}", got.error);
        // The text kept (`attach --record`'s sidecar): the lines as written, rotation and
        // all, none from before following began.
        assert_eq!(
            String::from_utf8_lossy(&got.text),
            "1:M 30 Nov 2026 22:55:01.000 * first\n\
             1:M 30 Nov 2026 22:55:02.000 * second, written in two pieces\n\
             1:M 30 Nov 2026 22:55:03.000 # third, in the new file\n"
        );
    }
}
