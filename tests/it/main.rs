//! The one integration-test binary: every end-to-end test, linked once (one binary instead of
//! a dozen keeps `cargo test` from linking the crate a dozen times). Each module is one area;
//! the live ones share `common` (servers, clients, the serial lock).

mod analysis_shape;
mod captures;
mod common;
mod crate_shape;
mod evidence_props;
mod iothreads;
mod live_attach;
mod live_cgroup;
mod live_cheap;
mod live_container;
mod live_edges;
mod live_fleet;
mod live_iothreads_backends;
mod live_memory;
mod live_watch;
mod parser_props;
mod redis_evidence;
mod render_cli;
mod source_edges;
mod sources_corpus;
mod variants;
mod wild_shapes;
