//! Renderers: the last stage of the pipeline. Each takes a finished `&Report` and a writer,
//! nothing else, so every output format shows exactly the same analysis: `table` and `json`
//! (the text report), `svg` (the timeline picture), `html` (a self-contained page with the
//! picture and the tables), `trace_export` (Chrome trace-event JSON for Perfetto /
//! chrome://tracing). `markup` holds what the picture renderers share.

pub mod html;
pub mod json;
pub mod markup;
pub mod svg;
pub mod table;
pub mod trace_export;

#[cfg(test)]
mod tests;
