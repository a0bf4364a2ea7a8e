//! Renderers: the last stage of the pipeline. Each takes a finished `&Report` and a writer,
//! nothing else, so every output format shows exactly the same analysis: `table` and `json`
//! (the text report), `svg` (the timeline picture), `html` (a self-contained page with the
//! picture and the tables), `trace_export` (Chrome trace-event JSON for Perfetto /
//! chrome://tracing). `markup` holds what the picture renderers share; `sections` decides
//! which sections the table and the HTML page show and with which rows, so those two
//! renderers only format.

pub mod html;
pub mod json;
pub mod lanes;
pub mod markup;
pub(crate) mod sections;
pub mod svg;
pub mod table;
pub mod trace_export;

/// The trace measured some duration: without timestamps and -T every duration in the report
/// is a 0 that was never measured, and the tables show `-` instead.
pub(crate) fn timed(r: &crate::report::Report) -> bool {
    r.summary.durations != crate::report::Durations::None
}

/// `≥` for a lower bound, `≤` for an upper bound, nothing for an exact figure.
pub fn bound_word(b: crate::report::Bound) -> &'static str {
    match b {
        crate::report::Bound::Exact => "",
        crate::report::Bound::AtLeast => "≥",
        crate::report::Bound::AtMost => "≤",
    }
}

/// A thread as the tables name it: its role, and its tid when the trace gave one (a
/// single-process trace without a pid column has none: tid 0).
pub fn thread_label(role: &str, tid: u32, parens: bool) -> String {
    match (tid, parens) {
        (0, _) => role.to_string(),
        (_, true) => format!("{role} ({tid})"),
        (_, false) => format!("{role} {tid}"),
    }
}

/// The file a call touched, for a table cell: `class name` for a path, or the name or label
/// alone when it already says what it is (`appendonly.aof`, `client connections`).
pub fn file_label(class: Option<crate::report::FileClass>, path: Option<&str>) -> String {
    use crate::report::FileClass;
    // Not a file name: the fd table's labels for sockets, pipes and other inodes.
    let label = |p: &str| !p.contains('/') && (p.contains(":[") || p == "client connections");
    // Which listener they came in on is in the FILES table; a slow call only needs to say it
    // was a client's socket.
    if class == Some(FileClass::Client) && path.is_some_and(label) {
        return "client connections".to_string();
    }
    match (class.as_ref().map(FileClass::as_str), path) {
        (Some(c), Some(p)) if label(p) && p.contains(c) => p.to_string(),
        (Some(c), Some(p)) if label(p) => format!("{c} {p}"),
        (Some(c), Some(p)) => {
            let name = p.rsplit('/').next().unwrap_or(p);
            if name.contains(c) {
                name.to_string()
            } else {
                format!("{c} {name}")
            }
        }
        (Some(c), None) => c.to_string(),
        (None, Some(p)) => p.to_string(),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests;
