//! stallscope: explains latency stalls of a redis-server from its system calls.
//!
//! Pipeline: `source` (strace/perf text, live tracers) -> `event::Event` -> `fdtable` and
//! thread bookkeeping -> `analyze` (stalls, roles, phases, commands, causes, findings) ->
//! `report::Report` -> `render` (table, JSON, ...). Every stage streams: memory is bounded by
//! the fd table, the unfinished-call map and fixed-size aggregates, never by trace length.

pub mod analyze;
pub mod cli;
pub mod docs;
pub mod event;
pub mod fdtable;
pub mod live;
pub mod progress;
pub mod redis_client;
pub(crate) mod redis_conf;
pub mod redis_evidence;
pub mod redis_log;
pub mod render;
pub mod report;
pub mod run;
pub mod source;
pub mod syscalls;
pub(crate) mod threads_file;
pub mod units;
pub mod watch;
