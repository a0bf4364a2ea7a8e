//! stallscope: explains latency stalls of a redis-server from its system calls.
//!
//! Pipeline: `source` (strace/perf text, live tracers) -> `event::Event` -> `fdtable` and
//! thread bookkeeping -> `analyze` (stalls, roles, phases, commands, causes, findings) ->
//! `report::Report` -> `render` (table, JSON, ...). Every stage streams: memory is bounded by
//! the fd table, the unfinished-call map and fixed-size aggregates, never by trace length.

pub(crate) mod analyze;
pub mod app;
pub mod cli;
pub(crate) mod clock;
pub(crate) mod docs;
pub mod event;
pub(crate) mod evidence;
pub(crate) mod fdtable;
pub(crate) mod handoff;
pub mod live;
pub(crate) mod progress;
pub(crate) mod recording;
pub(crate) mod redis_client;
pub(crate) mod redis_conf;
pub(crate) mod redis_log;
/// The join's old path, for the session code that calls it until it moves (`evidence`).
pub(crate) mod render;
pub(crate) mod report;
pub mod run;
pub(crate) mod session;
pub(crate) mod signals;
pub mod source;
pub(crate) mod syscalls;
pub(crate) mod threads_file;
pub(crate) mod units;
pub mod watch;
