//! Renderers: the last stage of the pipeline. Each takes a finished `&Report` and a writer,
//! nothing else, so every output format shows exactly the same analysis.

pub mod json;
pub mod table;
