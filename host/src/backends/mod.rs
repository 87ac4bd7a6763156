//! Backends: where they come from (embedded first-party set, a directory), how they are loaded
//! with their capabilities, and the registry that polls them and routes each resource's calls.

pub mod embedded;
mod registry;
mod source;

pub use registry::{BackendSummary, PollReport, Registry};
pub use source::{BackendSource, Origin, load_dir};
