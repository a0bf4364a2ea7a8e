//! What redis's signals say about each finding, and what its log lines mean. One job: the
//! words: which of redis's sources agree with a finding's stalls and which were read over
//! them and saw nothing (and why that is expected), and the causes redis's log wording names.

use super::axis::Axis;
use crate::redis_client::Collected;
use crate::report::{
    EvidenceSource, Finding, FindingId, LinePosition, LogMeaning, RedisEvidence, Report, Stall,
};

/// What a log line means, when redis's wording names a cause (the words differ a little
/// between redis and valkey, and across versions).
pub fn classify(msg: &str) -> Option<LogMeaning> {
    let m = msg;
    Some(
        if m.starts_with("Asynchronous AOF fsync is taking too long") {
            LogMeaning::AofFsyncTooLong
        } else if m.starts_with("Background saving started") {
            LogMeaning::SaveStarted
        } else if m.starts_with("Background saving terminated") {
            LogMeaning::SaveEnded
        } else if m.starts_with("Background saving error") {
            LogMeaning::SaveFailed
        } else if m.starts_with("Background append only file rewriting started") {
            LogMeaning::RewriteStarted
        } else if m.starts_with("Background AOF rewrite terminated")
            || m.starts_with("Background AOF rewrite finished")
        {
            LogMeaning::RewriteEnded
        } else if m.starts_with("Fork CoW") {
            LogMeaning::ChildCopyOnWrite
        } else if m.starts_with("DB saved on disk") {
            LogMeaning::ChildSaved
        } else if m.contains("fork") && m.contains("Cannot allocate memory") {
            LogMeaning::ForkFailed
        } else if m.starts_with("Error writing to the AOF") || m.contains("AOF write error") {
            LogMeaning::AofWriteError
        } else {
            return None;
        },
    )
}

/// The span (on the axis) over which the server's sources were read.
pub(super) struct Coverage {
    /// INFO: first and last answered poll.
    info: Option<(i64, i64)>,
    /// LATENCY and SLOWLOG: read at the end too (HISTORY, GET), so they cover everything
    /// since the first successful connection, back to what redis still remembers.
    history_from: Option<i64>,
}

pub(super) fn coverage(c: &Collected, axis: &Axis) -> Coverage {
    // INFO only tells a change between two answered polls: covered from the first poll sent
    // to the last answered.
    let info = match (c.info.first(), c.info.last()) {
        (Some(f), Some(l)) if c.info.len() >= 2 => {
            Some((axis.at(f.sent_ms * 1000), axis.at(l.at_ms * 1000)))
        }
        _ => None,
    };
    let history_from = if c.final_ok {
        Some(i64::MIN)
    } else {
        c.first_ok_ms.map(|f| axis.at(f * 1000))
    };
    Coverage { info, history_from }
}

pub(super) fn join_names(v: &[&str]) -> String {
    match v.len() {
        0 => String::new(),
        1 => v[0].to_string(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// The stalls a finding explains, over their span: what its signals are judged on.
pub(super) struct FindingStalls<'a> {
    stalls: Vec<&'a Stall>,
    first: i64,
    last: i64,
    worst_ms: i64,
}

impl<'a> FindingStalls<'a> {
    fn of(f: &Finding, r: &'a Report) -> Option<FindingStalls<'a>> {
        let stalls: Vec<&Stall> = r
            .stalls
            .iter()
            .filter(|s| s.finding == Some(f.id))
            .collect();
        Some(FindingStalls {
            first: stalls.iter().map(|s| s.at_us).min()?,
            last: stalls.iter().map(|s| s.at_us + s.duration_us).max()?,
            worst_ms: stalls.iter().map(|s| s.duration_us).max()? / 1000,
            stalls,
        })
    }

    fn evidence(&self) -> impl Iterator<Item = &'a RedisEvidence> + '_ {
        self.stalls
            .iter()
            .flat_map(|s| s.redis_evidence.iter().flatten())
    }

    /// How many of the stalls have an item that passes `pick`.
    fn count(&self, pick: impl Fn(&RedisEvidence) -> bool) -> usize {
        self.stalls
            .iter()
            .filter(|s| s.redis_evidence.iter().flatten().any(&pick))
            .count()
    }

    /// " (k of n stalls)", or nothing for a finding of one stall.
    fn of_n(&self, k: usize) -> String {
        match self.stalls.len() {
            1 => String::new(),
            n => format!(" ({k} of {n} stalls)"),
        }
    }
}

/// A log line agrees with a stall when it names it: a cause redis logs, or the line a
/// log-file stall was writing. Other lines in the window are listed as evidence but are not
/// agreement.
pub(super) fn names_the_stall(x: &RedisEvidence) -> bool {
    x.source == EvidenceSource::Log
        && (x.position == Some(LinePosition::BeingWritten) || x.meaning.is_some())
}

/// What redis's log says about a finding's stalls: Ok(agreement) or Err(silent) when it was
/// read over them and has nothing in their windows; None when it cannot say.
pub(super) fn log_signal(
    fs: &FindingStalls,
    log_span: Option<(i64, i64)>,
) -> Option<Result<String, ()>> {
    let (lf, ll) = log_span?;
    let k = fs.count(names_the_stall);
    let any = fs.count(|x| x.source == EvidenceSource::Log);
    if k == 0 && any > 0 {
        return Some(Ok(format!(
            "redis's log has lines in the window but none that names the stall{}",
            fs.of_n(any)
        )));
    }
    if k > 0 {
        return Some(Ok(format!("{}{}", log_agreement(fs), fs.of_n(k))));
    }
    (any == 0 && lf <= fs.first && ll >= fs.last).then_some(Err(()))
}

/// The most telling of the lines that name the stalls: "taking too long" first, then the
/// line redis was writing, then what it logged right after, then any other named cause.
pub(super) fn log_agreement(fs: &FindingStalls) -> String {
    let named: Vec<&RedisEvidence> = fs.evidence().filter(|x| names_the_stall(x)).collect();
    let at = |p: LinePosition| named.iter().filter(move |x| x.position == Some(p));
    if named
        .iter()
        .any(|x| x.meaning == Some(LogMeaning::AofFsyncTooLong))
    {
        return "redis's log says \"Asynchronous AOF fsync is taking too long\"".to_string();
    }
    if at(LinePosition::BeingWritten).next().is_some() {
        return "redis's log has the line it was writing when the stall began".to_string();
    }
    if let Some(m) = at(LinePosition::JustAfter).find_map(|x| x.meaning) {
        return format!("redis's log, just after: {}", m.words());
    }
    // A named line is a classified one here: its labels, up to the meaning's own colon.
    match named.first() {
        Some(x) => {
            let label: Vec<&str> = [
                x.position.map(LinePosition::words),
                x.meaning.map(LogMeaning::words),
            ]
            .into_iter()
            .flatten()
            .collect();
            let label = label.join("; ");
            format!("redis's log: {}", label.split(": ").next().unwrap_or(""))
        }
        None => "redis's log has lines in the stall's window".to_string(),
    }
}

/// The signals a finding gets from the server (`--redis`): agreements, and the sources read
/// over its stalls that saw nothing.
pub(super) fn server_signals(
    fs: &FindingStalls,
    cov: &Coverage,
    agree: &mut Vec<String>,
    silent: &mut Vec<&str>,
) {
    let hist = cov.history_from.is_some_and(|h| h <= fs.first);
    let k = fs.count(|x| x.source == EvidenceSource::Latency);
    if k > 0 {
        let mut ev: Vec<&str> = fs
            .evidence()
            .filter(|x| x.source == EvidenceSource::Latency)
            .map(|x| x.text.as_str())
            .collect();
        ev.dedup();
        let shown: Vec<&str> = ev.iter().take(3).copied().collect();
        agree.push(format!(
            "LATENCY {}{} in the same second{}",
            join_names(&shown),
            if ev.len() > 3 { ", ..." } else { "" },
            fs.of_n(k)
        ));
    } else if hist {
        silent.push("LATENCY");
    }
    let k = fs.count(|x| x.source == EvidenceSource::Slowlog);
    if k > 0 {
        agree.push(format!(
            "SLOWLOG has an entry in the same second{}",
            fs.of_n(k)
        ));
    } else if hist {
        silent.push("SLOWLOG");
    }
    let k = fs.count(|x| x.source == EvidenceSource::Info);
    if k > 0 {
        agree.push(format!(
            "INFO counters changed across the stall{}",
            fs.of_n(k)
        ));
    } else if cov
        .info
        .is_some_and(|(f0, l0)| f0 <= fs.first && l0 >= fs.last)
    {
        silent.push("INFO");
    }
}

/// The sentence a finding gets: which of redis's signals agree, which were silent and why
/// that is expected. None when the finding has no stalls or nothing of redis's was read.
pub(super) fn finding_signals(
    f: &Finding,
    r: &Report,
    log_span: Option<(i64, i64)>,
    server: Option<&Collected>,
    cov: Option<&Coverage>,
) -> Option<String> {
    let fs = FindingStalls::of(f, r)?;
    let mut agree = vec![];
    let mut silent: Vec<&str> = vec![];
    match log_signal(&fs, log_span) {
        Some(Ok(a)) => agree.push(a),
        Some(Err(())) => silent.push("redis's log"),
        None => {}
    }
    if let Some(cov) = cov {
        server_signals(&fs, cov, &mut agree, &mut silent);
    }
    if agree.is_empty() && silent.is_empty() {
        return None;
    }
    let mut s = agree.join("; ");
    if !silent.is_empty() {
        if !s.is_empty() {
            s.push_str("; ");
        }
        s.push_str(&format!("{} saw nothing", join_names(&silent)));
        let why = silence_reason(f.id, &silent, server, fs.worst_ms);
        if !why.is_empty() {
            s.push_str(": ");
            s.push_str(&why);
        }
    }
    Some(s)
}

/// Why a silent source is expected to be silent for this kind of stall.
pub(super) fn silence_reason(
    id: FindingId,
    silent: &[&str],
    server: Option<&Collected>,
    worst_ms: i64,
) -> String {
    use FindingId::*;
    let lat = silent.contains(&"LATENCY");
    let log = silent.contains(&"redis's log");
    let mut why = vec![];
    if lat {
        match server.and_then(|c| c.latency_threshold_ms) {
            Some(0) => {
                why.push("the latency monitor is off (latency-monitor-threshold 0)".to_string())
            }
            Some(t) if worst_ms < t => why.push(format!(
                "the worst stall, {worst_ms} ms, is under latency-monitor-threshold {t} ms"
            )),
            _ => {}
        }
    }
    if silent.contains(&"INFO") {
        why.push("INFO only counts delayed AOF fsyncs and forks".into());
    }
    match id {
        LogFileBlocking if lat => {
            why.push("a log-file stall is not a latency event in redis".into())
        }
        ChildDiskIo if lat => {
            why.push("redis does not time its save child's disk writes".into())
        }
        ChildDiskIo if log => {
            why.push("redis logs nothing about its save child's disk waits".into())
        }
        AofWriteAlone | AofWriteActiveChild | AofWritePendingFsync | AofFsyncAlways if log => {
            why.push(
                "redis logs \"taking too long\" only when the background fsync has been pending for 2 s".into(),
            )
        }
        _ => {}
    }
    why.join("; ")
}

/// Each finding gets the sentence of its signals (`redis_signals`), also appended to its
/// evidence. `log_span`: the span the log covers on the axis (everything, when followed
/// live); `cov`: what the server's polls covered.
pub(super) fn give_signals(
    report: &mut Report,
    log_span: Option<(i64, i64)>,
    server: Option<&Collected>,
    cov: Option<&Coverage>,
) {
    let signals: Vec<Option<String>> = report
        .findings
        .iter()
        .map(|f| finding_signals(f, report, log_span, server, cov))
        .collect();
    for (f, sig) in report.findings.iter_mut().zip(signals) {
        if let Some(s) = &sig {
            f.evidence = format!(
                "{}. Redis's own signals: {s}",
                f.evidence.trim_end_matches('.')
            );
        }
        f.redis_signals = Some(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{apply, Inputs};

    fn stall(at_us: i64, duration_us: i64, class: &str, finding: &str) -> Stall {
        Stall {
            who: crate::report::ThreadRef {
                pid: 1,
                tid: 1,
                thread: "main".into(),
            },
            syscall: Some("close".into()),
            target: crate::report::FdRef {
                fd: Some(9),
                path: None,
                class: Some(class.into()),
            },
            finding: Some(finding.into()),
            ..Stall::sample(at_us, duration_us)
        }
    }

    /// A live report on the epoch axis, 30 s long, with one log-file stall at 10 s and one
    /// DEBUG SLEEP-like gap at 20 s; redis was polled over the whole trace.
    fn live_report(threshold_ms: i64) -> (Report, Collected) {
        let base_s = 1_796_079_300;
        let mut r = Report::default();
        r.summary.start_iso = Some("2026-11-30T22:55:00.000000+00:00".into());
        r.summary.start = Some(format!("{base_s}.000000"));
        r.summary.span_us = 30_000_000;
        r.source.pid = Some(1);
        r.stalls
            .push(stall(10_000_000, 4_000_000, "log", "log-file-blocking"));
        r.stalls
            .push(stall(20_000_000, 300_000, "unknown", "command"));
        for id in ["log-file-blocking", "command"] {
            r.findings.push(crate::report::Finding {
                id: id.into(),
                severity: crate::report::Severity::Critical,
                title: String::new(),
                evidence: "e".into(),
                advice: String::new(),
                stalls: 1,
                redis_signals: None,
            });
        }
        let c = Collected {
            addr: "127.0.0.1:1".into(),
            latency_threshold_ms: Some(threshold_ms),
            latency: vec![crate::redis_client::LatencySample {
                event: "command".into(),
                ts: base_s + 20,
                latency_ms: 301,
            }],
            first_ok_ms: Some(base_s * 1000 - 500),
            last_ok_ms: Some((base_s + 31) * 1000),
            final_ok: true,
            polls: 31,
            ..Default::default()
        };
        (r, c)
    }

    #[test]
    fn findings_say_which_signals_agree_and_which_were_silent() {
        let (mut r, c) = live_report(100);
        apply(
            &mut r,
            Inputs {
                server: Some(c),
                ..Default::default()
            },
        )
        .unwrap();
        let sig: Vec<Option<String>> = r
            .findings
            .iter()
            .map(|f| f.redis_signals.clone().unwrap())
            .collect();
        let log = sig[0].as_deref().unwrap();
        assert!(log.contains("LATENCY and SLOWLOG saw nothing"), "{log}");
        assert!(
            log.contains("a log-file stall is not a latency event in redis"),
            "{log}"
        );
        // The log was not read: nothing is claimed about it.
        assert!(
            !log.contains("log:") && !log.contains("redis's log"),
            "{log}"
        );
        let cmd = sig[1].as_deref().unwrap();
        assert!(
            cmd.starts_with("LATENCY command 301 ms in the same second"),
            "{cmd}"
        );
        assert!(cmd.contains("SLOWLOG saw nothing"), "{cmd}");
        assert!(r.findings[0]
            .evidence
            .contains("Redis's own signals: LATENCY and SLOWLOG"));
        let ev = |i: usize| r.stalls[i].redis_evidence.as_deref().unwrap();
        assert!(ev(0).is_empty());
        assert_eq!(ev(1).len(), 1);
        assert_eq!(ev(1)[0].source, "latency");
        // Typed: the server's record in its own words, no log position or meaning.
        assert_eq!(ev(1)[0].text, "command 301 ms");
        assert_eq!((ev(1)[0].position, ev(1)[0].meaning), (None, None));
    }

    #[test]
    fn a_latency_monitor_that_is_off_is_named_as_the_reason() {
        let (mut r, mut c) = live_report(0);
        c.latency.clear();
        apply(
            &mut r,
            Inputs {
                server: Some(c),
                ..Default::default()
            },
        )
        .unwrap();
        let cmd = r.findings[1].redis_signals.clone().flatten().unwrap();
        assert!(
            cmd.contains("the latency monitor is off (latency-monitor-threshold 0)"),
            "{cmd}"
        );
    }

    #[test]
    fn a_server_never_reached_is_not_called_silent() {
        let (mut r, mut c) = live_report(100);
        c.first_ok_ms = None;
        c.last_ok_ms = None;
        c.final_ok = false;
        c.polls = 0;
        c.latency.clear();
        c.errors
            .push("--redis 127.0.0.1:1: cannot connect: refused".into());
        apply(
            &mut r,
            Inputs {
                server: Some(c),
                ..Default::default()
            },
        )
        .unwrap();
        let red = r.redis.as_ref().unwrap();
        assert!(
            r.findings.iter().all(|f| f.redis_signals == Some(None)),
            "{:?}",
            r.findings
        );
        assert!(red.notes.iter().any(|n| n.contains("cannot connect")));
        assert_eq!(r.findings[0].evidence, "e");
    }

    #[test]
    fn classified_lines() {
        assert_eq!(classify("Asynchronous AOF fsync is taking too long (disk is busy?). Writing the AOF buffer without waiting for fsync to complete, this may slow down Redis."), Some(LogMeaning::AofFsyncTooLong));
        assert_eq!(
            classify("Background saving started by pid 28169"),
            Some(LogMeaning::SaveStarted)
        );
        assert_eq!(
            classify("Background saving terminated with success"),
            Some(LogMeaning::SaveEnded)
        );
        assert_eq!(classify("Accepted 127.0.0.1:47826"), None);
    }
}
