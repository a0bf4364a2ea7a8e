//! Command line: the clap definition of every subcommand and flag, and the parsing of the
//! humane values they take (durations like `500us`, `10ms`, `0.2s`; dates). `main.rs` only
//! dispatches.

use crate::source::InputFormat;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "stallscope",
    version,
    about = "Explains latency stalls of a redis-server from its system calls",
    long_about = "Explains latency stalls of a redis-server from its system calls: reads saved strace or perf trace \
                  logs (or attaches to a live redis), finds every stall over a threshold (a slow syscall, or a gap in \
                  which redis's main thread made no syscall), names the thread, syscall and file, the client commands it held up, \
                  and what to change.\n\nExit status: 0 no stall over the threshold, 1 stalls found, 2 error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Analyze saved strace or perf trace output (files, `-` for stdin, .gz, or an `strace -ff` prefix)
    Analyze(AnalyzeArgs),
    /// Attach to a running redis-server (perf tracepoints or ptrace), print stalls as they happen and the full report at the end
    Attach(AttachArgs),
    /// Stay attached: write an incident report for each stall, export Prometheus metrics and
    /// JSON event lines, follow restarts; runs until SIGINT or SIGTERM
    Watch(WatchArgs),
    /// Print a shell completion script (bash, zsh or fish) to stdout
    Completions {
        #[arg(value_enum)]
        shell: crate::docs::CompletionShell,
    },
    /// Print the man page (roff) to stdout, or write one page per subcommand into DIR
    Man {
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Report stalls at least this long: a syscall that took it, or the main thread making no
    /// syscall for it (units: ns, us, ms, s)
    #[arg(long, short = 't', default_value = "10ms", value_parser = parse_duration)]
    pub threshold: i64,
    /// How many incidents and slow calls the table shows
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Output format
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Colour: auto (on a terminal, unless NO_COLOR is set), always, never
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Thread names: `ps -L -p PID` or `top -H -b -n1 -p PID` output, `grep . /proc/PID/task/*/comm`,
    /// or `TID NAME` lines
    #[arg(long, value_name = "FILE")]
    pub threads: Option<String>,
    /// The redis.conf in use: names the AOF, RDB and log files (dir, appendfilename, appenddirname,
    /// dbfilename, logfile) so nothing is guessed
    #[arg(long, value_name = "FILE")]
    pub redis_conf: Option<String>,
    /// redis's own log file (plain or gzip): its lines go on the timeline and each stall
    /// lists the ones in its window. Without it, a `NAME.redis.log` or `redis.log` beside the
    /// trace, or the logfile the redis config names, is used when it exists (live: the
    /// config's or the fd table's, followed as it is written)
    #[arg(long, value_name = "FILE")]
    pub redis_log: Option<String>,
    /// Also write a self-contained HTML report (timeline plot and tables) to FILE
    #[arg(long, value_name = "FILE")]
    pub html: Option<String>,
    /// Also write the timeline plot alone as SVG to FILE
    #[arg(long, value_name = "FILE")]
    pub svg: Option<String>,
    /// Also write a Chrome trace-event JSON file (open it in ui.perfetto.dev or chrome://tracing)
    #[arg(long, value_name = "FILE")]
    pub export_trace: Option<String>,
}

/// `watch --mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WatchMode {
    /// No syscall tracepoint while nothing is wrong; every syscall traced for --after
    /// once a stall is found
    Cheap,
    /// Every syscall traced all the time (0.77-0.87 of untraced redis throughput under
    /// redis-benchmark on 2 cores, against 0.97 for cheap)
    Full,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Auto,
    Bpf,
    Perf,
    Ptrace,
}

impl From<Backend> for crate::live::BackendChoice {
    fn from(b: Backend) -> Self {
        match b {
            Backend::Auto => Self::Auto,
            Backend::Bpf => Self::Bpf,
            Backend::Perf => Self::Perf,
            Backend::Ptrace => Self::Ptrace,
        }
    }
}

/// `--input-format`
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InputFormatArg {
    Auto,
    Strace,
    Perf,
}

impl From<InputFormatArg> for InputFormat {
    fn from(f: InputFormatArg) -> Self {
        match f {
            InputFormatArg::Auto => Self::Auto,
            InputFormatArg::Strace => Self::Strace,
            InputFormatArg::Perf => Self::Perf,
        }
    }
}

/// `--perf-pages`: a power of two from 1 to 2^20.
pub fn parse_pages(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of pages"))?;
    if n == 0 || !n.is_power_of_two() || n > 1 << 20 {
        return Err(format!(
            "{s:?}: the page count must be a power of two from 1 to 1048576"
        ));
    }
    Ok(n)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// Trace files (`-` for stdin; gzip is detected). Several files, or a prefix whose PREFIX.PID
    /// files exist, are `strace -ff` outputs merged by time.
    #[arg(default_value = "-")]
    pub files: Vec<String>,
    /// Input format, if detection from the first lines gets it wrong
    #[arg(long, value_enum, default_value_t = InputFormatArg::Auto)]
    pub input_format: InputFormatArg,
    /// Fail on the first line that cannot be read, instead of counting and skipping it
    #[arg(long)]
    pub strict: bool,
    /// The date of the first line for `-t`/`-tt` traces, which print only the time of day:
    /// YYYY-MM-DD, optionally with a UTC offset (2026-11-30+01:00; default: this machine's)
    #[arg(long, value_name = "DATE", value_parser = parse_date)]
    pub date: Option<(chrono::NaiveDate, i32)>,
    /// The traced redis-server's pid, when the trace does not say
    #[arg(long)]
    pub pid: Option<u32>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("target").args(["pid", "name"])))]
pub struct AttachArgs {
    /// The process to trace (every thread; forked children too unless --no-follow-forks)
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    /// Find the process by name instead (comm or argv[0]); default redis-server. An error
    /// lists the candidates when several match.
    #[arg(long)]
    pub name: Option<String>,
    /// Stop after this long (default: until Ctrl-C or SIGTERM)
    #[arg(long, short = 'd', value_parser = parse_duration)]
    pub duration: Option<i64>,
    /// Also write what was traced as strace text (`-f -ttt -T -y`) to FILE, for
    /// `stallscope analyze FILE` later; thread names go to FILE.threads
    #[arg(long, value_name = "FILE")]
    pub record: Option<String>,
    /// Do not trace forked children (the BGSAVE / AOF rewrite child)
    #[arg(long)]
    pub no_follow_forks: bool,
    /// How to trace: `bpf` runs kernel programs on the syscall tracepoints (redis is never
    /// stopped, command names are seen; needs root or CAP_BPF+CAP_PERFMON), `perf` reads the
    /// same tracepoints without buffer contents (needs tracefs and root or CAP_PERFMON),
    /// `ptrace` stops each thread at every syscall (works everywhere, slows a busy redis a
    /// lot), `auto` tries bpf, then perf, then ptrace, and says why
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// perf backend: ring-buffer size per CPU, in pages (a power of two); bpf backend: the
    /// size of its one ring buffer. Too small and the kernel drops events under load (they
    /// are counted and reported)
    #[arg(long, hide = true, value_name = "PAGES", value_parser = parse_pages)]
    pub perf_pages: Option<usize>,
    /// Also ask redis itself, on a connection of its own: LATENCY LATEST and INFO
    /// persistence/stats once a second, SLOWLOG GET at the start and the end (password from
    /// REDISCLI_AUTH, as redis-cli). When redis runs in a network namespace of its own (a
    /// container), HOST:PORT is inside it: 127.0.0.1:6379 is the container's, reached from
    /// the host through /proc/PID/ns/net. A failing connection is noted, never stops tracing
    #[arg(long, value_name = "HOST:PORT")]
    pub redis: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("target").args(["pid", "name", "all"])))]
pub struct WatchArgs {
    /// The process to watch (every thread; forked children too unless --no-follow-forks).
    /// When it exits, metrics go on with `stallscope_attached 0`, and its restart (the
    /// process listening on the same address, or named by its pidfile) is watched next
    #[arg(long, short = 'p')]
    pub pid: Option<u32>,
    /// Watch every process of this name (comm, argv[0] or executable; default
    /// redis-server), each as an instance of its own (as --all does), attaching to new
    /// ones as they start
    #[arg(long)]
    pub name: Option<String>,
    /// Watch every redis-server and valkey-server on the host, each as an instance labelled
    /// by its listening address (`instance` on every metric, reports under --out/INSTANCE/,
    /// `instance` in --events lines); new ones are found within a second, departed ones let
    /// go of. One set of bpf programs serves them all (the cheap tier's, and in --mode full the
    /// full programs'; an incident escalates only its own instance); --backend ptrace is refused
    #[arg(long)]
    pub all: bool,
    /// How to trace: `auto` picks the cheapest backend the kernel allows (bpf, else perf) and
    /// never falls back to ptrace; `ptrace` must be asked for, it slows a busy redis several times
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// `cheap` (the default; bpf only): no syscall tracepoint while nothing is wrong. A
    /// thread blocked in a syscall past --threshold (seen at its switch out and back in:
    /// the call and its fd named; forked children's threads too, unless --no-follow-forks)
    /// and a main thread that made no read or write for
    /// --threshold while on a CPU (its CPU time sampled every --sample-period: a gap's edges
    /// are known to that) are found; then every syscall is traced for --after, and the
    /// incident report has the detail of what followed. With --redis, a new LATENCY event or
    /// slow log entry escalates too (the full tier then sees only what followed that stall).
    /// It cannot see: command names and waiting clients before the escalation, a gap shorter
    /// than about two sampling periods, calls that did not block (a slow call on a CPU shows
    /// as a gap, unnamed). `full`:
    /// every syscall traced all the time (today's watch; --backend perf or ptrace imply it)
    #[arg(long, value_enum, default_value_t = WatchMode::Cheap)]
    pub mode: WatchMode,
    /// cheap mode: the sampling period of the main thread's CPU time
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub sample_period: i64,
    /// A stall is a syscall at least this long, or the main thread making no syscall for it
    #[arg(long, short = 't', default_value = "10ms", value_parser = parse_duration)]
    pub threshold: i64,
    /// Write one incident report (JSON and HTML) into DIR for each stall, or group of
    /// overlapping stalls; files are readable by owner and group only
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
    /// Keep this much history before a stall for its incident report
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub before: i64,
    /// After a stall ends, keep recording this long before writing its incident (a stall
    /// in that time joins the same incident)
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub after: i64,
    /// Memory for the history ring (--before; in cheap mode what the full tier records for
    /// an incident): under heavy load it covers less time, and the report's span says how much
    /// (units: KiB, MiB, GiB; default 32MiB, 8MiB in cheap mode, which keeps the watcher's
    /// peak RSS under 64 MiB through an incident of a saturated redis). With several
    /// instances it is one budget split equally between their rings (1 MiB each at least)
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub ring_size: Option<usize>,
    /// Also keep each incident's raw recording (strace text) beside its report
    #[arg(long)]
    pub record: bool,
    /// Incident reports written per hour at most; the rest are counted
    /// (stallscope_incidents_suppressed_total)
    #[arg(long, default_value_t = 12)]
    pub max_incidents_per_hour: u32,
    /// Serve Prometheus/OpenMetrics metrics on ADDR (`127.0.0.1:9323`; a bare port or
    /// `:PORT` binds loopback)
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Write one JSON line per stall as it ends to FILE (appended), or `-` for stdout
    #[arg(long, value_name = "FILE")]
    pub events: Option<String>,
    /// Do not trace forked children (the BGSAVE / AOF rewrite child)
    #[arg(long)]
    pub no_follow_forks: bool,
    /// Stop after this long (default: until SIGINT or SIGTERM)
    #[arg(long, short = 'd', value_parser = parse_duration)]
    pub duration: Option<i64>,
    /// perf backend: ring-buffer size per CPU, in pages (a power of two)
    #[arg(long, hide = true, value_name = "PAGES", value_parser = parse_pages)]
    pub perf_pages: Option<usize>,
    /// What redis tells beside the trace: its config, its server and its log.
    #[command(flatten)]
    pub from_redis: WatchRedisArgs,
}

/// `watch`'s sources from redis itself (flattened into its options).
#[derive(Args, Debug, Default)]
pub struct WatchRedisArgs {
    /// The redis.conf in use (default: found from the process's command line)
    #[arg(long, value_name = "FILE")]
    pub redis_conf: Option<String>,
    /// Also ask redis itself, on a connection of its own: LATENCY LATEST and INFO
    /// persistence/stats once a second, SLOWLOG GET and LATENCY HISTORY once per incident
    /// (password from REDISCLI_AUTH, as redis-cli); each incident report says which of
    /// redis's signals saw its stalls. In the cheap mode each poll also reads SLOWLOG GET 8,
    /// and a new LATENCY event or slow log entry (not the poller's own) escalates to the
    /// full tier as a stall does (`watch_tiers.trigger` in the report). When redis runs in a network namespace of its own (a
    /// container), HOST:PORT is inside it: 127.0.0.1:6379 is the container's, reached from
    /// the host through /proc/PID/ns/net. A failing connection is noted, never stops watching
    #[arg(long, value_name = "HOST:PORT")]
    pub redis: Option<String>,
    /// redis's own log file, followed as it is written; its lines go into the incidents
    /// they fall in (default: the logfile the redis config names)
    #[arg(long, value_name = "FILE")]
    pub redis_log: Option<String>,
}

impl WatchArgs {
    /// `--ring-size`, or the mode's default.
    pub fn ring_bytes(&self) -> usize {
        self.ring_size.unwrap_or(match self.mode {
            WatchMode::Cheap => 8 << 20,
            WatchMode::Full => 32 << 20,
        })
    }
}

/// `64MiB`, `512KiB`, `1GiB`, `1000000` (bytes) -> bytes
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: use e.g. 64MiB, 512KiB, 1GiB"))?;
    let mult: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KiB" | "k" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        u => return Err(format!("unknown unit {u:?} in {s:?}: use KiB, MiB, GiB")),
    };
    match v.checked_mul(mult) {
        Some(n) if n >= 1 << 20 => Ok(n),
        Some(_) => Err(format!("{s:?}: the ring needs at least 1MiB")),
        None => Err(format!("{s:?} is out of range")),
    }
}

/// `500us`, `10ms`, `0.2s`, `1500000ns`, `2m` -> ns
///
/// ```
/// use stallscope::cli::parse_duration;
/// assert_eq!(parse_duration("10ms"), Ok(10_000_000));
/// assert_eq!(parse_duration("0.2s"), Ok(200_000_000));
/// assert!(parse_duration("10").is_err()); // a unit is required
/// ```
pub fn parse_duration(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: use e.g. 500us, 10ms, 0.2s"))?;
    let mult = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "" => return Err(format!("{s:?} has no unit: write 10ms, 500us or 0.2s")),
        u => return Err(format!("unknown unit {u:?} in {s:?}: use ns, us, ms, s")),
    };
    let ns = v * mult;
    if !(ns.is_finite() && ns > 0.0 && ns < 1e15) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(ns as i64)
}

/// `2026-11-30` or `2026-11-30+01:00` -> (date, UTC offset in seconds)
pub fn parse_date(s: &str) -> Result<(chrono::NaiveDate, i32), String> {
    let (d, off) = if s.len() > 10 && s.is_char_boundary(10) {
        s.split_at(10)
    } else {
        (s, "")
    };
    let date = chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d")
        .map_err(|e| format!("{s:?}: expected YYYY-MM-DD: {e}"))?;
    let off = if off.is_empty() {
        use chrono::{Local, Offset, TimeZone};
        let noon = date.and_hms_opt(12, 0, 0).ok_or("bad date")?;
        Local
            .from_local_datetime(&noon)
            .single()
            .map(|t| t.offset().fix().local_minus_utc())
            .unwrap_or(0)
    } else if off == "Z" {
        0
    } else {
        let sign = match off.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return Err(format!("{s:?}: the offset must look like +01:00")),
        };
        let hm: Vec<&str> = off[1..].split(':').collect();
        let h: i32 = hm
            .first()
            .and_then(|x| x.parse().ok())
            .ok_or(format!("{s:?}: bad offset"))?;
        let m: i32 = hm.get(1).and_then(|x| x.parse().ok()).unwrap_or(0);
        sign * (h * 3600 + m * 60)
    };
    Ok((date, off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500us"), Ok(500_000));
        assert_eq!(parse_duration("10ms"), Ok(10_000_000));
        assert_eq!(parse_duration("0.2s"), Ok(200_000_000));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("10parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("2097152"), Ok(2 << 20));
        assert!(parse_bytes("10KiB").unwrap_err().contains("at least"));
        assert!(parse_bytes("5 parsecs").is_err());
    }

    #[test]
    fn dates() {
        let (d, off) = parse_date("2026-11-30+01:30").unwrap();
        assert_eq!(d.to_string(), "2026-11-30");
        assert_eq!(off, 5400);
        assert_eq!(parse_date("2026-11-30Z").unwrap().1, 0);
        assert!(parse_date("30/11/2026").is_err());
        assert!(parse_date("2026-11-3é+01:00").is_err());
        assert!(parse_date("2026-11-30é").is_err());
    }
}
