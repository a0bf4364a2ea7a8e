//! JSON renderer: the report as REPORT.md's `stallscope/1` object, for scripts and tests.

use crate::report::Report;
use std::io::{self, Write};

/// Generic over the writer: through `&mut dyn Write` every one of serde_json's small
/// writes (a key, a quote, a comma) was a virtual call into `BufWriter::write_all`, about a
/// third of the JSON's cost on a report of thousands of stalls; a concrete `BufWriter`
/// inlines its copy into the buffer.
pub fn render<W: Write + ?Sized>(report: &Report, w: &mut W) -> io::Result<()> {
    match &report.redis {
        None => serde_json::to_writer_pretty(&mut *w, report).map_err(io_error)?,
        Some(_) => {
            let v = with_redis_evidence(report).map_err(io_error)?;
            serde_json::to_writer_pretty(&mut *w, &v).map_err(io_error)?
        }
    }
    writeln!(w)
}

/// serde_json's error as an I/O error of the same kind: a reader that went away (`| head`)
/// stays a broken pipe, which the program ends on quietly, not an error of kind `Other`.
fn io_error(e: serde_json::Error) -> io::Error {
    match e.io_error_kind() {
        Some(kind) => io::Error::new(kind, e),
        None => io::Error::other(e),
    }
}

/// The report with redis's evidence written into each stall, phase and finding, where the
/// JSON contract puts it (`redis_evidence`, `redis_signals`).
fn with_redis_evidence(report: &Report) -> serde_json::Result<serde_json::Value> {
    let mut v = serde_json::to_value(report)?;
    let Some(red) = &report.redis else {
        return Ok(v);
    };
    let put = |v: &mut serde_json::Value,
               list: &str,
               key: &str,
               items: &mut dyn Iterator<Item = serde_json::Value>| {
        if let Some(arr) = v.get_mut(list).and_then(|a| a.as_array_mut()) {
            for (obj, item) in arr.iter_mut().zip(items) {
                if let Some(o) = obj.as_object_mut() {
                    o.insert(key.into(), item);
                }
            }
        }
    };
    let ev = |e: &Vec<crate::report::RedisEvidence>| serde_json::to_value(e).unwrap_or_default();
    put(
        &mut v,
        "stalls",
        "redis_evidence",
        &mut red.stall_evidence.iter().map(ev),
    );
    put(
        &mut v,
        "in_flight",
        "redis_evidence",
        &mut red.in_flight_evidence.iter().map(ev),
    );
    put(
        &mut v,
        "phases",
        "redis_evidence",
        &mut red.phase_evidence.iter().map(ev),
    );
    put(
        &mut v,
        "findings",
        "redis_signals",
        &mut red
            .finding_signals
            .iter()
            .map(|s| serde_json::to_value(s).unwrap_or_default()),
    );
    Ok(v)
}
