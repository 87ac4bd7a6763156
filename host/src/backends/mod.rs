//! Backends: where they come from (embedded first-party set, a directory), how they are loaded
//! with their capabilities, the registry that polls them and routes each resource's calls, and
//! the directory watch that hot-swaps them.

pub mod embedded;
mod manifest;
mod registry;
mod source;
mod startup;
pub mod uevents;
pub mod watch;

pub use manifest::Manifest;
pub use registry::{
    BackendSummary, PollDone, PollJob, PollReport, PublishHook, Registry, Retired, StatsSnapshot, Swapped,
};
pub use source::{BackendSource, Origin, load_dir, manifest_for, split_version};
pub use startup::{load_all, sources};
