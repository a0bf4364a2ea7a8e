//! The report: built once by the analyzers at the end of the pipeline, serializable, and the
//! JSON schema documented in `docs/REPORT.md` (`stallscope/1`). Renderers (table, JSON, SVG/HTML,
//! trace export) take `&Report` and a writer, nothing else. Keys named in REPORT.md are never
//! renamed or dropped; extra keys are added freely. Times are µs unless named otherwise.

use serde::Serialize;

pub const SCHEMA: &str = "stallscope/1";

/// How to rerun strace so that a trace measures its calls and the time between them: the
/// findings and the table's headline both say it.
pub const RERUN: &str = "rerun strace with -ttt -T (strace -f -ttt -T -p PID -o FILE)";

/// A closed set of report values with one JSON spelling each.
macro_rules! closed_set {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Default)]
        pub enum $name {
            #[default]
            $($(#[$vm])* #[serde(rename = $s)] $v),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $s),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        #[cfg(test)]
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        /// Tests spell values as the JSON does.
        #[cfg(test)]
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                *$name::ALL
                    .iter()
                    .find(|v| v.as_str() == s)
                    .unwrap_or_else(|| panic!("no {} {s:?}", stringify!($name)))
            }
        }
    };
}

/// Thread roles (REPORT.md `thread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Main,
    BioAof,
    BioCloseFile,
    BioLazyFree,
    /// valkey's thread for saves without a fork (`bio_rdb_save`).
    BioRdbSave,
    /// valkey's TLS certificate reload thread (`bio_tls_reload`).
    BioTlsReload,
    /// jemalloc's background purge thread (`jemalloc_bg_thd`, redis's `jemalloc-bg-thread`).
    JemallocBg,
    IoThread,
    Child,
    #[default]
    Other,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::BioAof => "bio_aof",
            Role::BioCloseFile => "bio_close_file",
            Role::BioLazyFree => "bio_lazy_free",
            Role::BioRdbSave => "bio_rdb_save",
            Role::BioTlsReload => "bio_tls_reload",
            Role::JemallocBg => "jemalloc_bg",
            Role::IoThread => "io_thread",
            Role::Child => "child",
            Role::Other => "other",
        }
    }
}

/// Compares with the role as the JSON spells it.
#[cfg(test)]
impl PartialEq<&str> for Role {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

closed_set!(
    /// How redis's log was found (`redis.log.found`).
    LogFound {
        /// Named by the user.
        Flag => "--redis-log",
        /// `NAME.redis.log` or `redis.log` beside the trace, or a recording's own copy of
        /// the lines (`FILE.redis.log`).
        BesideTrace => "beside the trace",
        /// The `logfile` of a redis config (given, beside the trace, or the live process's).
        ConfLogfile => "redis.conf logfile",
        /// Live: what redis at `--redis` says its logfile is.
        ConfigGet => "CONFIG GET logfile",
        /// The log file the trace saw redis write, where it exists here.
        TraceLogFile => "the trace's log file",
    }
);

closed_set!(
    /// Which layout a log line was written in (`redis.log.formats[]`).
    LogFormat {
        Redis3 => "redis 3+ (PID:ROLE DD Mon YYYY HH:MM:SS.mmm LEVEL)",
        Redis2 => "redis 2.x ([PID] DD Mon HH:MM:SS LEVEL, no year)",
        ValkeyIso => "valkey log-timestamp-format iso8601",
        ValkeyMillis => "valkey log-timestamp-format milliseconds",
        Logfmt => "valkey log-format logfmt",
        SignalHandler => "signal-handler lines (epoch seconds)",
    }
);

closed_set!(
    /// How the trace's durations were known (`summary.durations`).
    Durations {
        Measured => "measured",
        Reconstructed => "reconstructed",
        Mixed => "mixed",
        /// No timestamps and no -T: nothing is measured, and no stall is reported.
        None => "none",
    }
);

closed_set!(
    /// What a background child did (`phases[].kind`).
    PhaseKind {
        Bgsave => "bgsave",
        AofRewrite => "aof_rewrite",
        /// Not known: the child was not traced and an AOF was in use.
        Child => "child",
    }
);

closed_set!(
    /// Which calls a command row counts (`commands[].phase`): all, or those before, during
    /// or after the longest phase.
    CommandPhase {
        All => "all",
        Before => "before",
        During => "during",
        After => "after",
    }
);

closed_set!(
    /// What was read (`source.kind`).
    SourceKind {
        Strace => "strace",
        Perf => "perf",
        /// `attach`, and `watch`'s incident reports.
        Live => "live",
    }
);

closed_set!(
    /// What the trace's timestamps can say (`source.clock`).
    ClockKind {
        /// Wall clock with a date.
        Absolute => "absolute",
        /// `-t`/`-tt` without `--date`.
        TimeOfDay => "time_of_day",
        /// `-r`, and perf's timestamps.
        Relative => "relative",
        None => "none",
    }
);

closed_set!(
    /// The live backend that traced (`source.backend`).
    LiveBackend {
        Ptrace => "ptrace",
        Perf => "perf",
        Bpf => "bpf",
    }
);

closed_set!(
    /// What ended a background child's phase (`phases[].ended_by`).
    EndedBy {
        Exit => "exit",
        Sigchld => "SIGCHLD",
        Wait4 => "wait4",
    }
);

closed_set!(
    /// Which of redis's own sources said it (`redis_evidence[].source`).
    EvidenceSource {
        Log => "log",
        Latency => "latency",
        Info => "info",
        Slowlog => "slowlog",
    }
);

closed_set!(
    /// What a log line means, when redis's wording names a cause (`redis.lines[].meaning`,
    /// `redis_evidence[].meaning`): decided once, where the log is joined onto the trace.
    LogMeaning {
        AofFsyncTooLong => "aof_fsync_too_long",
        SaveStarted => "bgsave_started",
        SaveEnded => "bgsave_ended",
        SaveFailed => "bgsave_failed",
        RewriteStarted => "aof_rewrite_started",
        RewriteEnded => "aof_rewrite_ended",
        ChildCopyOnWrite => "child_copy_on_write",
        ChildSaved => "child_saved",
        ForkFailed => "fork_failed",
        AofWriteError => "aof_write_error",
    }
);

impl LogMeaning {
    /// The meaning in words, as the evidence's `what` says it.
    pub fn words(self) -> &'static str {
        match self {
            LogMeaning::AofFsyncTooLong => {
                "AOF fsync too long: redis wrote the AOF without waiting for the background fsync"
            }
            LogMeaning::SaveStarted => "background save started",
            LogMeaning::SaveEnded => "background save ended",
            LogMeaning::SaveFailed => "background save failed",
            LogMeaning::RewriteStarted => "AOF rewrite started",
            LogMeaning::RewriteEnded => "AOF rewrite ended",
            LogMeaning::ChildCopyOnWrite => "copy-on-write of the save child",
            LogMeaning::ChildSaved => "the save child finished writing",
            LogMeaning::ForkFailed => "fork failed",
            LogMeaning::AofWriteError => "AOF write error",
        }
    }
}

closed_set!(
    /// Where a log line sits relative to the stall whose evidence it is
    /// (`redis_evidence[].position`).
    LinePosition {
        /// The stalled thread's process wrote it last before the stall began.
        JustBefore => "just_before",
        /// As `just_before`, for a stall on the log file itself: its write or close blocked.
        BeingWritten => "being_written",
        /// The stalled thread's process wrote it within 20 ms after the stall ended.
        JustAfter => "just_after",
    }
);

impl LinePosition {
    /// The position in words, as the evidence's `what` says it.
    pub fn words(self) -> &'static str {
        match self {
            LinePosition::JustBefore => "written just before the stall",
            LinePosition::BeingWritten => "the line being written when the stall began",
            LinePosition::JustAfter => "written just after the stall",
        }
    }
}

/// What a `phase_stats` row measures: the main thread's file syscalls, or one command
/// (`main_file_syscalls` | `command:NAME` in the JSON).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum PhaseStatsOf {
    #[default]
    MainFileSyscalls,
    Command(String),
}

impl std::fmt::Display for PhaseStatsOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PhaseStatsOf::MainFileSyscalls => f.write_str("main_file_syscalls"),
            PhaseStatsOf::Command(c) => write!(f, "command:{c}"),
        }
    }
}

impl Serialize for PhaseStatsOf {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What a file descriptor points at, in redis terms (REPORT.md `class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FileClass {
    Aof,
    AofManifest,
    AofRewriteTemp,
    Rdb,
    RdbTemp,
    Log,
    Client,
    Listener,
    Replica,
    /// A connection the process made itself (`connect`): to a server it is a client of, a
    /// cluster peer, a primary; the replication link (`replica`) only once PSYNC, SYNC or
    /// REPLCONF is sent on it.
    Outgoing,
    Pipe,
    Epoll,
    Dir,
    Proc,
    /// An in-memory fd with no file behind it (`anon_inode:[eventfd]`, timerfd, signalfd,
    /// inotify, a memfd): its calls never wait for a disk. redis 8's main and I/O threads
    /// hand clients to each other through eventfds.
    AnonInode,
    Other,
    #[default]
    Unknown,
}

impl FileClass {
    pub fn as_str(&self) -> &'static str {
        match self {
            FileClass::Aof => "aof",
            FileClass::AofManifest => "aof_manifest",
            FileClass::AofRewriteTemp => "aof_rewrite_temp",
            FileClass::Rdb => "rdb",
            FileClass::RdbTemp => "rdb_temp",
            FileClass::Log => "log",
            FileClass::Client => "client",
            FileClass::Listener => "listener",
            FileClass::Replica => "replica",
            FileClass::Outgoing => "outgoing",
            FileClass::Pipe => "pipe",
            FileClass::Epoll => "epoll",
            FileClass::Dir => "dir",
            FileClass::Proc => "proc",
            FileClass::AnonInode => "anon_inode",
            FileClass::Other => "other",
            FileClass::Unknown => "unknown",
        }
    }

    /// A file on disk whose syscalls can block on I/O.
    pub fn is_disk_file(&self) -> bool {
        matches!(
            self,
            FileClass::Aof
                | FileClass::AofManifest
                | FileClass::AofRewriteTemp
                | FileClass::Rdb
                | FileClass::RdbTemp
                | FileClass::Log
                | FileClass::Dir
                | FileClass::Other
        )
    }

    pub fn is_aof(&self) -> bool {
        matches!(self, FileClass::Aof | FileClass::AofManifest)
    }
}

/// Who wrote a log line, by its role mark (redis's `M`/`S`/`C`/`X`, valkey's words).
/// Serialized as the word: "master", "replica", "child", "sentinel", "signal-handler", or
/// valkey's own word for a role redis has no mark for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRole {
    Master,
    Replica,
    Child,
    Sentinel,
    SignalHandler,
    Other(Box<str>),
}

impl LogRole {
    pub fn as_str(&self) -> &str {
        match self {
            LogRole::Master => "master",
            LogRole::Replica => "replica",
            LogRole::Child => "child",
            LogRole::Sentinel => "sentinel",
            LogRole::SignalHandler => "signal-handler",
            LogRole::Other(w) => w,
        }
    }
}

impl serde::Serialize for LogRole {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A log line's level (signal-handler lines have none). Ordered by verbosity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Verbose,
    Notice,
    Warning,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Verbose => "verbose",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
        }
    }
}

impl std::fmt::Display for FileClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Report {
    pub schema: &'static str,
    pub source: Source,
    pub summary: Summary,
    pub skipped: Vec<Skipped>,
    pub syscalls: Vec<SyscallStats>,
    pub fds: Vec<FdStats>,
    /// The slowest calls of the trace, whatever the threshold (at most `--top`).
    pub slowest: Vec<SlowCall>,
    pub stalls: Vec<Stall>,
    /// Calls still running when the trace ended (or already running when it began) whose
    /// known part is below the threshold: listed so a call still blocked is never silent.
    pub in_flight: Vec<Stall>,
    /// Calls still blocked when the trace ended that are their thread's wait for work (no
    /// stall, so not in `in_flight`): what each parked thread waits in.
    pub parked_at_end: Vec<Parked>,
    /// Stalls that overlap in time, merged: what a client saw as one freeze.
    pub incidents: Vec<Incident>,
    pub threads: Vec<ThreadInfo>,
    pub phases: Vec<Phase>,
    /// Per-phase before/during/after statistics of the main thread's file syscalls.
    pub phase_stats: Vec<PhaseStats>,
    pub commands: Vec<CommandStats>,
    pub findings: Vec<Finding>,
    /// Idle time (waits that are not stalls) per thread role.
    pub idle: Vec<IdleStats>,
    #[serde(flatten)]
    pub live: LiveContext,
    /// A bounded sample of individual calls for timelines (trace export, plots): per thread,
    /// the slowest calls at or above a floor. None when the analyzer did not keep one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
    /// What redis itself said (its log, LATENCY, INFO, SLOWLOG) on the trace's time axis,
    /// when any of it was read (`redis_evidence`). Its per-stall, per-phase and per-finding
    /// parts are written into those objects as `redis_evidence` / `redis_signals`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSection>,
}

/// An incident of `watch`'s default mode: the cheap tier (always attached, no syscall
/// tracepoint) found its first stalls, or redis's own signals (`--redis`) said it stalled
/// (`trigger`); the full tier (every syscall) was attached from `full_from` for `--after`
/// and saw what followed. The cheap tier's stalls are in `stalls` with `tier` named in
/// their `cause`.
#[derive(Clone, Debug, Serialize, Default)]
pub struct WatchTiers {
    /// What opened the incident and escalated to the full tier: `stall` (the cheap tier
    /// found one over the threshold), `latency-event` (a new LATENCY LATEST event) or
    /// `slowlog` (the slow log grew).
    pub trigger: String,
    /// The redis signal that opened it, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_signal: Option<RedisSignal>,
    /// What the cheap tier watches, in words.
    pub cheap: String,
    /// The sampling period of the main thread's CPU time: a gap's start and end are each
    /// known to about this much of its CPU time.
    pub sample_period_us: i64,
    /// Stalls the cheap tier found in this incident (in `stalls`).
    pub cheap_stalls: u64,
    /// When the full tier was attached (absent: it was not, and `stalls` holds only the
    /// cheap tier's), and what it saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_from: Option<String>,
    pub full: String,
    /// How exact each figure is, and what neither tier saw.
    pub notes: Vec<String>,
}

/// A sign from redis itself that it stalled (`watch --redis`): a LATENCY LATEST event newer
/// than at the previous poll, or the slow log's newest entry. Names only: no key, no argument.
#[derive(Clone, Debug, Serialize, Default, PartialEq)]
pub struct RedisSignal {
    /// `latency` or `slowlog`.
    pub source: String,
    /// The latency event's name (`command`, `fork`, `aof-fsync-always`...), or the slow
    /// command's name.
    pub name: String,
    /// When redis says it ended (it stamps them to the second), ISO 8601.
    pub ended: String,
    /// How long redis measured it (LATENCY: to the millisecond).
    pub duration_us: i64,
    /// When the poll (once a second) saw it, ISO 8601.
    pub seen: String,
}

/// The top-level `container` section: what names the container the traced process runs in
/// and how the host reached it. Read back too: a recording keeps it (`FILE.container`).
#[derive(Clone, Debug, Serialize, serde::Deserialize, Default, PartialEq)]
pub struct Container {
    /// Its cgroup path (/proc/PID/cgroup: the one that names the container, else the
    /// unified hierarchy's, else the cpu or memory controller's).
    pub cgroup: Option<String>,
    /// `docker`, `containerd`, `cri-o` or `podman`, when the cgroup path names it.
    pub runtime: Option<String>,
    /// The container id the cgroup path names.
    pub id: Option<String>,
    /// The Kubernetes pod's uid, when the path is under `kubepods`.
    pub kubernetes_pod_uid: Option<String>,
    /// The pod's QoS class (`guaranteed`, `burstable`, `besteffort`).
    pub kubernetes_qos: Option<String>,
    /// The host name in its UTS namespace (a pod's name), when that namespace is its own.
    pub hostname: Option<String>,
    /// The kinds of namespace (`mnt`, `pid`, `net`, `uts`...) that differ from stallscope's.
    pub namespaces: Vec<String>,
    /// Where its files were read (`/proc/PID/root`), when it has a file tree of its own.
    pub files_via: Option<String>,
    /// Its processes' pids as the host numbers them and as its own pid namespace does
    /// (what its log prints), when that namespace is its own.
    pub pids: Vec<NsPid>,
}

/// One process's pid on the host and inside its pid namespace.
#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize, Default, PartialEq, Eq)]
pub struct NsPid {
    pub host: u32,
    pub ns: u32,
}

/// What only a live session sees (flattened into the report: `host`, `overhead`,
/// `container`, `cgroup`, `cpus`; all absent offline).
#[derive(Clone, Debug, Serialize, Default)]
pub struct LiveContext {
    /// /proc samples aligned with phases and stalls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostContext>,
    /// What tracing cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// The container the traced process runs in, seen from the host (its own namespaces,
    /// or a cgroup a container runtime made); absent on a bare host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
    /// `watch`'s default mode only: which tier saw which part of the incident, and how
    /// exact each figure is (`WatchTiers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_tiers: Option<WatchTiers>,
    /// The traced process's cgroup, its limits and what they did over the trace (absent in
    /// the root cgroup with no limits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupReport>,
    /// The CPUs the traced process may run on, read at the attach (absent when they could
    /// not be read, and offline: a trace does not tell them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Cpus>,
}

/// The CPUs a process may run on: those online that its threads' affinity allows (redis
/// can pin its threads: `server-cpulist`, `bio-cpulist`; taskset, a container's cpuset).
/// Its cgroup's CPU quota, another limit, is in `cgroup`.
#[derive(Clone, Debug, Serialize, Default, PartialEq, Eq)]
pub struct Cpus {
    /// The online CPUs any of its threads may run on (the union of their
    /// `Cpus_allowed_list`), in the kernel's list form ("0-1,4") and counted.
    pub allowed_list: String,
    pub allowed: u32,
    /// The CPUs online on the host (/sys/devices/system/cpu/online).
    pub online: u32,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Source {
    pub kind: SourceKind,
    pub files: Vec<String>,
    /// What was detected, in the tracer's own words, e.g. "strace -f -tt -T -y".
    pub format: String,
    pub pid: Option<u32>,
    pub clock: ClockKind,
    /// Live only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<LiveBackend>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Summary {
    pub lines: u64,
    pub events: u64,
    pub syscalls: u64,
    pub threads: u64,
    pub processes: u64,
    /// First timestamp as printed in the trace.
    pub start: Option<String>,
    /// ISO 8601 wall-clock time of the first event, when the source allows it.
    pub start_iso: Option<String>,
    pub span_us: i64,
    pub skipped_lines: u64,
    pub durations: Durations,
    pub threshold_us: i64,
    /// `--top`: how many incidents and slow calls the table shows.
    pub top: usize,
    pub stalls: u64,
    /// Stalls counted but not listed: only the longest `stalls` are kept in detail.
    pub stalls_not_listed: u64,
    /// Live perf backend: events lost to ring-buffer overflow (0 for offline sources).
    pub lost_events: u64,
    /// Calls still running when the trace ended.
    pub in_flight_at_end: u64,
    /// Calls already running when the trace began.
    pub in_flight_at_start: u64,
    /// Threads strace said it attached to (`attached with 11 threads`) that made no call in
    /// the trace: silent, each blocked in one call since before the trace, or idle.
    #[serde(skip_serializing_if = "is_zero")]
    pub silent_threads: u64,
    /// A trace of many programs (`perf trace -a`): the programs other than redis, by comm
    /// (their calls are counted, their waits are not redis's stalls). Absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_programs: Vec<String>,
    /// Live bpf backend: where per-command latency starts (absent elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_start: Option<CommandStart>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a command's latency starts (`summary.command_start`).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CommandStart {
    /// When its request was queued on redis's socket, for the commands counted in
    /// `commands[].from_arrival`; the others as `EventLoop`.
    Arrival,
    /// When redis's event loop found it (its wait's return, or the call before a wait that
    /// returned at once): the kernel could not date arrivals.
    EventLoop,
}

/// A line that could not be read. In JSON `reason` is the reason's phrase, after the
/// file's name when the trace has several files.
#[derive(Clone, Debug)]
pub struct Skipped {
    pub line: u64,
    /// The file it is in, when the trace has several.
    pub file: Option<String>,
    pub reason: SkipReason,
    /// The start of the offending line (lossy UTF-8, cut at 120 bytes).
    pub text: String,
}

impl Skipped {
    /// `reason` as the report spells it: "FILE: PHRASE", or the phrase alone.
    pub fn reason_text(&self) -> std::borrow::Cow<'static, str> {
        match &self.file {
            Some(f) => format!("{f}: {}", self.reason).into(),
            None => self.reason.as_str().into(),
        }
    }
}

impl Serialize for Skipped {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Skipped", 3)?;
        m.serialize_field("line", &self.line)?;
        m.serialize_field("reason", &self.reason_text())?;
        m.serialize_field("text", &self.text)?;
        m.end()
    }
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct SyscallStats {
    pub name: String,
    pub calls: u64,
    pub errors: u64,
    pub total_us: i64,
    pub p50_us: i64,
    pub p99_us: i64,
    pub max_us: i64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct FdStats {
    pub pid: u32,
    pub fd: i32,
    pub path: Option<String>,
    pub class: FileClass,
    pub calls: u64,
    pub total_us: i64,
    pub p50_us: i64,
    pub p99_us: i64,
    pub max_us: i64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct SlowCall {
    pub ts: String,
    pub at_us: i64,
    #[serde(flatten)]
    pub who: ThreadRef,
    pub syscall: String,
    #[serde(flatten)]
    pub target: FdRef,
    pub duration_us: i64,
    pub line: Option<u64>,
    pub bound: Bound,
}

#[derive(Clone, Copy, Debug, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    #[default]
    Exact,
    AtLeast,
    /// Reconstructed from the next event of the thread: the call took at most this long.
    AtMost,
}

closed_set!(
    /// How a stall's duration is known (`stalls[].duration_known`): only `measured` and
    /// `paired` durations can carry a critical finding.
    DurationKnown {
        /// `-T`, perf trace's duration, a live tracer's clock; for a gap: both of its edges.
        Measured => "measured",
        /// An unfinished call paired with its resumed line.
        Paired => "paired",
        /// Up to the thread's next event: the call (or gap) took at most this long.
        UpperBound => "upper_bound",
        /// Not known at all (a call cut by the trace's end or by an unreadable line).
        Unknown => "unknown",
        /// `watch`'s cheap tier: each edge known to its sampling period (a gap) or to the
        /// thread's switches (a blocked call: from its switch-out to its switch-in).
        Sampled => "sampled",
    }
);

impl DurationKnown {
    /// Measured or paired: a duration that can carry a critical finding.
    pub fn is_known(self) -> bool {
        matches!(self, DurationKnown::Measured | DurationKnown::Paired)
    }
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StallKind {
    SlowSyscall,
    Gap,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stall {
    pub ts: String,
    pub ts_iso: Option<String>,
    pub at_us: i64,
    #[serde(flatten)]
    pub who: ThreadRef,
    pub kind: StallKind,
    pub syscall: Option<String>,
    #[serde(flatten)]
    pub target: FdRef,
    pub duration_us: i64,
    pub line: Option<u64>,
    pub cause: String,
    pub finding: Option<FindingId>,
    pub bound: Bound,
    /// How `duration_us` is known.
    pub duration_known: DurationKnown,
    pub in_flight: Option<crate::event::InFlight>,
    #[serde(flatten)]
    pub waiting: Waiting,
    /// Index into `phases` of the background child running at the time, if any.
    pub phase: Option<usize>,
    /// Events were lost (live perf backend) around this stall: it may be incomplete.
    pub events_lost: bool,
    /// Where the thread's time went over the stall (live backends only; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sched: Option<StallSched>,
    /// A gap that ran through calls of the thread's own housekeeping (memory management,
    /// futex, time and identity queries), which serve no client: how many (absent when none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet_calls: Option<u32>,
    /// What redis said in the stall's window, once its signals were joined onto a trace with
    /// a wall clock (absent otherwise; possibly empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_evidence: Option<Vec<RedisEvidence>>,
}

#[cfg(test)]
impl Stall {
    /// A stall for unit tests: a `write` of process 100's main thread, `duration_us` long,
    /// `at_us` into the trace, measured, nothing else known; tests set what they need
    /// (`Stall { .., ..Stall::sample(at, dur) }`).
    pub(crate) fn sample(at_us: i64, duration_us: i64) -> Stall {
        Stall {
            ts: String::new(),
            ts_iso: None,
            at_us,
            who: ThreadRef {
                pid: 100,
                tid: 100,
                thread: Role::Main,
            },
            kind: StallKind::SlowSyscall,
            syscall: Some("write".into()),
            target: FdRef::default(),
            duration_us,
            line: None,
            cause: String::new(),
            finding: None,
            bound: Bound::Exact,
            duration_known: DurationKnown::Measured,
            in_flight: None,
            waiting: Waiting::default(),
            phase: None,
            events_lost: false,
            sched: None,
            quiet_calls: None,
            redis_evidence: None,
        }
    }
}

/// The thread a call or a stall belongs to (flattened into its object: `pid`, `tid`, `thread`).
#[derive(Clone, Debug, Serialize, Default, PartialEq, Eq)]
pub struct ThreadRef {
    pub pid: u32,
    pub tid: u32,
    pub thread: Role,
}

/// The fd a call worked on and what it is (flattened into its object: `fd`, `path`, `class`).
#[derive(Clone, Debug, Serialize, Default, PartialEq, Eq)]
pub struct FdRef {
    pub fd: Option<i32>,
    pub path: Option<String>,
    pub class: Option<FileClass>,
}

/// The client commands that waited behind a stall (flattened into it: `waiting_*`,
/// `worst_wait_us`).
#[derive(Clone, Debug, Serialize, Default, PartialEq, Eq)]
pub struct Waiting {
    #[serde(rename = "waiting_commands")]
    pub commands: u64,
    /// The waiting commands by command name.
    #[serde(rename = "waiting_by_command")]
    pub by_command: std::collections::BTreeMap<String, u64>,
    #[serde(rename = "waiting_clients")]
    pub clients: u64,
    #[serde(rename = "worst_wait_us")]
    pub worst_us: Option<i64>,
}

/// A thread's wait for work still blocked when the trace ended (`Report::parked_at_end`).
#[derive(Clone, Debug, Serialize)]
pub struct Parked {
    /// When the wait began.
    pub ts: String,
    pub at_us: i64,
    pub pid: u32,
    pub tid: u32,
    pub thread: Role,
    pub syscall: String,
    pub fd: Option<i32>,
    pub path: Option<String>,
    pub class: Option<FileClass>,
    /// How long it had waited when the trace ended, as far as the trace knows (at least).
    pub known_us: i64,
    pub line: Option<u64>,
}

/// A stall's time split by the scheduler: on a CPU, runnable (waiting for a CPU), blocked
/// (the rest), and the page faults taken meanwhile.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StallSched {
    pub on_cpu_us: i64,
    pub runnable_us: i64,
    pub blocked_us: i64,
    /// Of `runnable_us`, the time the thread's cgroup was throttled by its CPU quota (bpf
    /// backend, where the kernel's throttle state is read; absent where it is not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled_us: Option<i64>,
    /// The time the thread spent reclaiming memory itself in the stall (its cgroup's memory
    /// limit, or the host short of free memory), exact: bpf on the kernel's vmscan
    /// tracepoints; absent where not measured. It overlaps the three parts above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim_us: Option<i64>,
    pub minor_faults: u64,
    pub major_faults: u64,
    /// The call was already running when tracing began: the split covers only its traced
    /// part (from the attach, as `duration_us` does), not what it did before.
    #[serde(skip_serializing_if = "is_false")]
    pub since_attach: bool,
    /// A main-thread gap that was its wait for its I/O threads (finding `io-threads`): of
    /// it, the time those I/O threads waited for a CPU (absent on other stalls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_threads_runnable_us: Option<i64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl StallSched {
    /// From the counters over a stall of `dur_ns`. The runnable time is exact: the kernel
    /// adds each wait for a CPU as the thread gets one, and the counters are read while the
    /// thread runs (bpf, perf) or is stopped (ptrace). On-CPU time is updated at scheduler
    /// ticks and switches, so each reading trails by up to a tick and their difference may
    /// be a tick off either way: it is clamped to what the runnable time leaves of the
    /// stall, and the blocked rest at zero.
    pub fn of(d: &crate::event::SchedDelta, dur_ns: i64) -> Self {
        let run = (d.runnable_ns as i64).min(dur_ns.max(0));
        let on = (d.on_cpu_ns as i64).min(dur_ns.max(0) - run);
        StallSched {
            on_cpu_us: on / 1000,
            runnable_us: run / 1000,
            blocked_us: (dur_ns - on - run).max(0) / 1000,
            throttled_us: d.throttled_ns.map(|t| (t as i64).min(run) / 1000),
            reclaim_us: d.reclaim_ns.map(|t| (t as i64).min(dur_ns.max(0)) / 1000),
            minor_faults: d.minor_faults,
            major_faults: d.major_faults,
            since_attach: false,
            io_threads_runnable_us: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Incident {
    pub start_at_us: i64,
    pub end_at_us: i64,
    pub ts: String,
    pub duration_us: i64,
    /// Indexes into `stalls`.
    pub stalls: Vec<usize>,
    pub waiting_commands: u64,
    pub waiting_clients: u64,
    pub worst_wait_us: Option<i64>,
    pub finding: Option<FindingId>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThreadInfo {
    pub pid: u32,
    pub tid: u32,
    pub role: Role,
    pub name: Option<String>,
    /// How the role was decided: "name", "tid==pid", "epoll_wait", "fdatasync on aof", ...
    pub why: String,
    pub syscalls: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub kind: PhaseKind,
    pub child_pid: u32,
    pub start_at_us: i64,
    pub end_at_us: Option<i64>,
    pub fork_us: Option<i64>,
    pub ts: String,
    /// What ended it; null while still running at trace end.
    pub ended_by: Option<EndedBy>,
    /// Files the child wrote, by class.
    pub wrote: Vec<FileClass>,
    /// What redis said about this child, once its signals were joined (as a stall's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_evidence: Option<Vec<RedisEvidence>>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct PhaseStats {
    pub phase: usize,
    pub what: PhaseStatsOf,
    pub before: Dist,
    pub during: Dist,
    pub after: Dist,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Dist {
    pub count: u64,
    pub p50_us: i64,
    pub p99_us: i64,
    pub max_us: i64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct CommandStats {
    pub command: String,
    pub phase: CommandPhase,
    pub calls: u64,
    pub p50_us: i64,
    pub p99_us: i64,
    pub max_us: i64,
    /// Time spent in AOF syscalls while serving this command (sum over calls).
    pub aof_us: i64,
    /// Time spent in log-file syscalls while serving this command (sum over calls).
    pub log_us: i64,
    /// Of `calls`, those timed from their request's measured arrival (live bpf backend).
    #[serde(skip_serializing_if = "is_zero")]
    pub from_arrival: u64,
}

/// What a finding (and each stall it explains) is about: REPORT.md `findings[].id`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum FindingId {
    AofFsyncAlways,
    AofWriteActiveChild,
    AofWritePendingFsync,
    AofWriteAlone,
    LogFileBlocking,
    Fork,
    CowPageFaults,
    CpuStarvation,
    CpuThrottled,
    MemoryReclaim,
    Command,
    IoThreads,
    DiskContention,
    SlowFileIo,
    AofFsyncBackground,
    ChildCowReport,
    ChildDiskIo,
    FilteredTrace,
    GapsUnmeasurable,
    Unexplained,
    BackendLimits,
    TracerOverhead,
    WatchIncident,
    AwaitsReply,
    LockWait,
    OffCpu,
    OwnWork,
}

impl FindingId {
    /// The id as the JSON and the table show it.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingId::AofFsyncAlways => "aof-fsync-always",
            FindingId::AofWriteActiveChild => "aof-write-active-child",
            FindingId::AofWritePendingFsync => "aof-write-pending-fsync",
            FindingId::AofWriteAlone => "aof-write-alone",
            FindingId::LogFileBlocking => "log-file-blocking",
            FindingId::Fork => "fork",
            FindingId::CowPageFaults => "cow-page-faults",
            FindingId::CpuStarvation => "cpu-starvation",
            FindingId::CpuThrottled => "cpu-throttled",
            FindingId::MemoryReclaim => "memory-reclaim",
            FindingId::Command => "command",
            FindingId::IoThreads => "io-threads",
            FindingId::DiskContention => "disk-contention",
            FindingId::SlowFileIo => "slow-file-io",
            FindingId::AofFsyncBackground => "aof-fsync-background",
            FindingId::ChildCowReport => "child-cow-report",
            FindingId::ChildDiskIo => "child-disk-io",
            FindingId::FilteredTrace => "filtered-trace",
            FindingId::GapsUnmeasurable => "gaps-unmeasurable",
            FindingId::Unexplained => "unexplained",
            FindingId::BackendLimits => "backend-limits",
            FindingId::TracerOverhead => "tracer-overhead",
            FindingId::WatchIncident => "watch-incident",
            FindingId::AwaitsReply => "awaits-reply",
            FindingId::LockWait => "lock-wait",
            FindingId::OffCpu => "off-cpu",
            FindingId::OwnWork => "own-work",
        }
    }
}

impl FindingId {
    pub const ALL: [FindingId; 27] = [
        FindingId::AofFsyncAlways,
        FindingId::AofWriteActiveChild,
        FindingId::AofWritePendingFsync,
        FindingId::AofWriteAlone,
        FindingId::LogFileBlocking,
        FindingId::Fork,
        FindingId::CowPageFaults,
        FindingId::CpuStarvation,
        FindingId::CpuThrottled,
        FindingId::MemoryReclaim,
        FindingId::Command,
        FindingId::IoThreads,
        FindingId::DiskContention,
        FindingId::SlowFileIo,
        FindingId::AofFsyncBackground,
        FindingId::ChildCowReport,
        FindingId::ChildDiskIo,
        FindingId::FilteredTrace,
        FindingId::GapsUnmeasurable,
        FindingId::Unexplained,
        FindingId::BackendLimits,
        FindingId::TracerOverhead,
        FindingId::WatchIncident,
        FindingId::AwaitsReply,
        FindingId::LockWait,
        FindingId::OffCpu,
        FindingId::OwnWork,
    ];
}

/// Tests spell ids as the JSON does.
#[cfg(test)]
impl From<&str> for FindingId {
    fn from(s: &str) -> Self {
        *FindingId::ALL
            .iter()
            .find(|f| f.as_str() == s)
            .unwrap_or_else(|| panic!("no finding id {s:?}"))
    }
}

/// Tests spell classes as the JSON does.
#[cfg(test)]
impl From<&str> for FileClass {
    fn from(s: &str) -> Self {
        use FileClass::*;
        *[
            Aof,
            AofManifest,
            AofRewriteTemp,
            Rdb,
            RdbTemp,
            Log,
            Client,
            Listener,
            Replica,
            Pipe,
            Epoll,
            Dir,
            Proc,
            Other,
            Unknown,
        ]
        .iter()
        .find(|c| c.as_str() == s)
        .unwrap_or_else(|| panic!("no file class {s:?}"))
    }
}

/// Tests spell roles as the JSON does.
#[cfg(test)]
impl From<&str> for Role {
    fn from(s: &str) -> Self {
        use Role::*;
        *[
            Main,
            BioAof,
            BioCloseFile,
            BioLazyFree,
            BioRdbSave,
            BioTlsReload,
            JemallocBg,
            IoThread,
            Child,
            Other,
        ]
        .iter()
        .find(|r| r.as_str() == s)
        .unwrap_or_else(|| panic!("no role {s:?}"))
    }
}

/// Compares with the id as the JSON spells it.
#[cfg(test)]
impl PartialEq<&str> for FindingId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for FindingId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub id: FindingId,
    pub severity: Severity,
    pub title: String,
    pub evidence: String,
    pub advice: String,
    /// How many stalls this finding explains.
    pub stalls: u64,
    /// Once redis's signals were joined onto a trace with a wall clock: which agree with
    /// this finding's stalls and which were silent, in words, or null when there is nothing
    /// to say. Absent when they were not joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_signals: Option<Option<String>>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct IdleStats {
    pub role: Role,
    pub syscall: String,
    pub calls: u64,
    pub total_us: i64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct HostContext {
    pub sample_interval_ms: u64,
    pub samples: Vec<HostSample>,
    /// Human-readable comparisons ("during the BGSAVE: minor faults 9,300/s vs 570/s before").
    pub notes: Vec<String>,
    /// Pressure over the whole trace (absent on a kernel without PSI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
}

/// The cgroup version a process's controllers were read from.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    #[default]
    V1,
    V2,
}

/// A cgroup's limits (absent: none).
#[derive(Clone, Debug, Serialize, Default, PartialEq)]
pub struct CgroupLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_quota_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_period_us: Option<u64>,
    /// `cpu.max.burst` / `cpu.cfs_burst_us`, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_burst_us: Option<u64>,
    /// v2 `memory.max` and `memory.high`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_high_bytes: Option<u64>,
    /// v1 `memory.limit_in_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_in_bytes: Option<u64>,
}

impl CgroupLimits {
    /// A quota with its period: "30 ms per 100 ms".
    pub fn quota(&self) -> Option<(u64, u64)> {
        Some((self.cpu_quota_us?, self.cpu_period_us?))
    }
    /// The memory limit that reclaim starts at: v2 high, else max, else v1's limit.
    pub fn memory_limit(&self) -> Option<(&'static str, u64)> {
        self.memory_high_bytes
            .map(|b| ("memory.high", b))
            .or(self.memory_max_bytes.map(|b| ("memory.max", b)))
            .or(self
                .memory_limit_in_bytes
                .map(|b| ("memory.limit_in_bytes", b)))
    }
    /// A CPU quota or a memory limit is set (a period alone limits nothing).
    pub fn any(&self) -> bool {
        self.cpu_quota_us.is_some() || self.memory_limit().is_some()
    }
}

/// What the cgroup's counters did over the trace (deltas from the first reading to the last).
#[derive(Clone, Debug, Serialize, Default, PartialEq)]
pub struct CgroupTotals {
    /// CFS periods with runnable tasks, and those the quota ran out in.
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_us: u64,
    /// v2 `memory.events` high and max, and OOM; v1 `memory.failcnt`.
    pub memory_high_events: u64,
    pub memory_max_events: u64,
    pub memory_oom_events: u64,
    pub memory_failcnt: u64,
    /// Pages reclaimed by the cgroup's own tasks (v2 `memory.stat` pgsteal_direct).
    pub direct_reclaimed_pages: u64,
}

/// What counted against the memory limit at the end of the trace (bytes).
#[derive(Clone, Debug, Serialize, Default, PartialEq)]
pub struct CgroupMemory {
    pub usage_bytes: u64,
    pub anon_bytes: u64,
    /// Page cache: the AOF's, the RDB's and the log's pages are charged here.
    pub file_bytes: u64,
}

/// The report's `cgroup`: where the traced process runs and what its limits did.
#[derive(Clone, Debug, Serialize, Default)]
pub struct CgroupReport {
    pub version: CgroupVersion,
    /// The CPU controller's cgroup (v2: the one cgroup).
    pub path: String,
    /// v1, when the memory controller's cgroup is another one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_path: Option<String>,
    pub limits: CgroupLimits,
    pub totals: CgroupTotals,
    pub memory: CgroupMemory,
}

/// Pressure over a window: the share of it (%) in which some (or every) task waited for
/// the resource.
#[derive(Clone, Debug, Serialize, Default, PartialEq)]
pub struct PressureShares {
    pub cpu_some_pct: f64,
    pub io_some_pct: f64,
    pub io_full_pct: f64,
    pub memory_some_pct: f64,
    pub memory_full_pct: f64,
}

/// The host's and the cgroup's pressure over the whole trace (PSI).
#[derive(Clone, Debug, Serialize, Default)]
pub struct Pressure {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<PressureShares>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PressureShares>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct HostSample {
    pub at_us: i64,
    pub minflt_per_s: f64,
    pub majflt_per_s: f64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub iowait_pct: f64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Overhead {
    pub syscalls_per_s: f64,
    /// Whether the backend stops redis at each call (ptrace); otherwise nothing is stopped
    /// and the cost to watch is lost records.
    pub stops_redis: bool,
    pub mean_stop_us: f64,
    pub warning: Option<String>,
}

/// Most calls a timeline keeps per thread: enough to see the shape of a trace in Perfetto,
/// small enough that the report of a 20 GB trace stays a few MB.
pub const TIMELINE_MAX_PER_THREAD: usize = 20_000;

/// The calls kept for timelines. The full trace is never held in memory, so this is a
/// sample: per thread, the `max_per_thread` slowest calls whose duration is at least
/// `floor_us`, whatever the threshold; idle waits (epoll_wait of the main thread, the futex of
/// idle bio threads) are left out like they are from stalls.
#[derive(Clone, Debug, Serialize, Default)]
pub struct Timeline {
    pub floor_us: i64,
    pub max_per_thread: usize,
    /// Calls at or above the floor that were not kept because their thread's quota was full.
    pub dropped: u64,
    /// Sorted by `at_us`.
    pub calls: Vec<TimelineCall>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct TimelineCall {
    /// Start of the call, µs since the first event (the same clock as `Stall::at_us`).
    pub at_us: i64,
    pub pid: u32,
    pub tid: u32,
    pub syscall: String,
    #[serde(flatten)]
    pub target: FdRef,
    pub duration_us: i64,
    pub bound: Bound,
    /// Input line where the call ends, null live.
    pub line: Option<u64>,
}

/// One thing redis said that falls in a stall's (or a phase's) window.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RedisEvidence {
    pub source: EvidenceSource,
    /// ISO 8601 (or, when the trace has no date, the log's own stamp).
    pub ts: String,
    /// On the report's axis (µs since the first event).
    pub at_us: i64,
    /// In words for a person, made from the fields below when the evidence is joined
    /// (nothing reads it back).
    pub what: String,
    /// A log line: where it sits relative to the stall (else null).
    pub position: Option<LinePosition>,
    /// A log line whose wording names a cause: which (else null).
    pub meaning: Option<LogMeaning>,
    /// A log line: who wrote it, as redis names it (`master 27995`, `child 28169`); null for
    /// the server's sources.
    pub who: Option<String>,
    /// What redis said: a log line's message (at most 200 characters), or the server's
    /// record (`command 301 ms`, `#12 DEBUG took 301 ms`, `aof_delayed_fsync 3 -> 4`).
    pub text: String,
}

/// The top-level `redis` section.
#[derive(Clone, Debug, Serialize, Default)]
pub struct RedisSection {
    pub log: Option<RedisLogInfo>,
    /// How redis's times were put on the trace's axis, in words (which clock, which offset).
    pub clock: String,
    /// The trace's date, when it was taken from the log (`-t/-tt` trace without --date).
    pub date_from_log: Option<String>,
    /// The UTC offset assumed for log times that do not carry one ("+00:00").
    pub utc_offset: Option<String>,
    /// Log lines in the trace's window (at most `LOG_LINES_MAX`).
    pub lines: Vec<RedisLogLine>,
    pub lines_not_listed: u64,
    /// `--redis HOST:PORT`, when given.
    pub server: Option<RedisServerInfo>,
    /// Things the reader should know (a log that ends before the trace, a failed poll).
    pub notes: Vec<String>,
}

pub const LOG_LINES_MAX: usize = 2000;

#[derive(Clone, Debug, Serialize, Default)]
pub struct RedisLogInfo {
    pub path: String,
    pub found: LogFound,
    /// The layouts seen, most lines first.
    pub formats: Vec<LogFormat>,
    pub lines_read: u64,
    pub unparsed_lines: u64,
    /// First and last record of the file, as printed.
    pub first: Option<String>,
    pub last: Option<String>,
    /// Live: the file was followed while tracing (new lines read as written).
    pub followed: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct RedisLogLine {
    pub at_us: i64,
    /// As printed in the log.
    pub ts: String,
    pub line: u64,
    pub pid: Option<u32>,
    pub role: LogRole,
    pub level: Option<LogLevel>,
    pub message: String,
    /// What the line means, when its wording names a cause (else null).
    pub meaning: Option<LogMeaning>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct RedisServerInfo {
    pub addr: String,
    pub polls: u64,
    pub latency_monitor_threshold_ms: Option<i64>,
    pub slowlog_log_slower_than_us: Option<i64>,
    pub latency: Vec<RedisLatency>,
    pub slowlog: Vec<RedisSlow>,
    pub info: Vec<RedisInfoSample>,
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct RedisLatency {
    pub event: String,
    /// Epoch seconds, as redis stamped it.
    pub ts: i64,
    pub at_us: i64,
    pub latency_ms: i64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct RedisSlow {
    pub id: i64,
    pub ts: i64,
    pub at_us: i64,
    pub duration_us: i64,
    /// The command name only (never its arguments).
    pub command: String,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct RedisInfoSample {
    pub at_us: i64,
    pub fields: std::collections::BTreeMap<String, i64>,
}

/// Why a line was not used (the report's `skipped[].reason`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
pub enum SkipReason {
    Empty,
    NoSyscall,
    BadReturn,
    ResumedWithoutName,
    TooLong,
    CutOff,
    BadTimestamp,
    /// A compressed input that ends early: the rest of the file (one line counted for it).
    CutShort,
    /// `perf trace`'s `LOST N events!`: its ring buffer dropped records there.
    Lost,
    /// A `perf trace` line that pairs an exit with an entry across lost events.
    AcrossLoss,
    /// `[...]`, `...`, `…` on a line of its own: lines left out there (by whoever pasted
    /// the trace into a book, a mail or a ticket).
    Elided,
    /// A call line with a `-T` duration but no result (`write(8, "+OK\r\n", 5 <0.000010>`):
    /// a paste ate its end. The call returned; it is no call still running.
    Damaged,
}

impl SkipReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            SkipReason::Empty => "empty line",
            SkipReason::NoSyscall => "not a syscall, signal, exit or strace message",
            SkipReason::BadReturn => "syscall line with an unreadable return value",
            SkipReason::ResumedWithoutName => "resumed line without a syscall name",
            SkipReason::TooLong => "line longer than the limit",
            SkipReason::CutOff => "cut-off line (no result, no <unfinished ...>)",
            SkipReason::BadTimestamp => "timestamp does not match the trace's format",
            SkipReason::CutShort => "compressed input ends early: the rest of the file is missing",
            SkipReason::Lost => "perf lost events here: what the threads did meanwhile is unknown",
            SkipReason::AcrossLoss => {
                "perf paired this exit with an entry across lost events: which call, and how long, is unknown"
            }
            SkipReason::Elided => {
                "lines left out here ([...]): what the threads did meanwhile is unknown"
            }
            SkipReason::Damaged => {
                "damaged call line (a duration but no result: its end was cut, it is no call still running)"
            }
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spelled<T: Serialize>(v: T) -> String {
        serde_json::to_string(&v).unwrap().replace('"', "`")
    }

    /// REPORT.md is the contract: every value a closed set can take is listed there, so a
    /// variant added here without its documentation fails.
    #[test]
    fn report_md_lists_every_closed_value() {
        let doc = include_str!("../docs/REPORT.md");
        let sets = doc
            .split("## Closed value sets")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("REPORT.md has a closed value sets section");
        let mut values: Vec<String> = vec![];
        values.extend(Durations::ALL.iter().map(spelled));
        values.extend(PhaseKind::ALL.iter().map(spelled));
        values.extend(CommandPhase::ALL.iter().map(spelled));
        values.extend([CommandStart::Arrival, CommandStart::EventLoop].map(spelled));
        values.extend(SourceKind::ALL.iter().map(spelled));
        values.extend(ClockKind::ALL.iter().map(spelled));
        values.extend(LiveBackend::ALL.iter().map(spelled));
        values.extend(EndedBy::ALL.iter().map(spelled));
        values.extend(EvidenceSource::ALL.iter().map(spelled));
        values.extend(LinePosition::ALL.iter().map(spelled));
        values.extend(LogMeaning::ALL.iter().map(spelled));
        values.extend(FindingId::ALL.iter().map(spelled));
        values.extend(LogFound::ALL.iter().map(spelled));
        values.extend(LogFormat::ALL.iter().map(spelled));
        values.extend(
            [
                "main",
                "bio_aof",
                "bio_close_file",
                "bio_lazy_free",
                "io_thread",
                "child",
                "other",
            ]
            .map(|r| spelled(Role::from(r))),
        );
        values.extend(
            [
                "aof",
                "aof_manifest",
                "aof_rewrite_temp",
                "rdb",
                "rdb_temp",
                "log",
                "client",
                "listener",
                "replica",
                "pipe",
                "epoll",
                "dir",
                "proc",
                "other",
                "unknown",
            ]
            .map(|c| spelled(FileClass::from(c))),
        );
        values.extend([Severity::Info, Severity::Warning, Severity::Critical].map(spelled));
        values.extend([Bound::Exact, Bound::AtLeast, Bound::AtMost].map(spelled));
        values.extend([StallKind::SlowSyscall, StallKind::Gap].map(spelled));
        let missing: Vec<&String> = values
            .iter()
            .filter(|v| !sets.contains(v.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "not in REPORT.md's closed value sets: {missing:?}"
        );
        // A literal check that `spelled` is the JSON spelling.
        assert_eq!(spelled(EndedBy::Sigchld), "`SIGCHLD`");
        assert_eq!(
            serde_json::to_string(&PhaseStatsOf::Command("SET".into())).unwrap(),
            "\"command:SET\""
        );
    }
}
