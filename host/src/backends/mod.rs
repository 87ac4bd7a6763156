//! Backends: where they come from (embedded first-party set, a directory, a registry followed
//! over time), how they are loaded with their capabilities, the registry that polls them and
//! routes each resource's calls, and the watches (directory, uevents) that trigger swaps and
//! polls. Nothing here knows kubelet: a resource that has devices is handed up as a
//! [`ReadyResource`] and the daemon serves it.

pub mod embedded;
mod follow;
mod manifest;
mod reconcile;
mod registry;
mod settings;
mod source;
mod startup;
pub mod uevents;
pub mod watch;

pub use follow::{Follower, SourceStatus, Statuses};
pub use settings::{BackendSettings, Catalog, DefaultGrant};

pub use manifest::Manifest;
pub use reconcile::{Changes, Reconciler};
pub use registry::{
    BackendMetrics, BackendSummary, PollDone, PollJob, PollReport, PublishHook, ReadyResource, Registry, ResourceCalls,
    Retired, StatsSnapshot, Swapped,
};
pub use source::{BackendSource, Origin, load_dir, manifest_for, split_version};
pub use startup::{load_all, sources};
