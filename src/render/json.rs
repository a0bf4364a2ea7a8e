//! JSON renderer: the report as REPORT.md's `stallscope/1` object, for scripts and tests.

use crate::report::Report;
use std::io::{self, Write};

pub fn render(report: &Report, w: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *w, report).map_err(io::Error::other)?;
    writeln!(w)
}
