//! Renderers: the end of the pipeline. Each is a pure function of the finished `Report` and
//! a writer: `svg` (the timeline picture), `html` (a self-contained page with the picture and
//! the tables), `trace_export` (Chrome trace-event JSON for Perfetto / chrome://tracing).
//! `markup` holds what the picture renderers share.

pub mod html;
pub mod markup;
pub mod svg;
pub mod trace_export;

#[cfg(test)]
mod tests;
