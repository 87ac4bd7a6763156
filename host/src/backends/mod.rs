//! Backends: where they come from (embedded first-party set, a directory, an OCI registry
//! reference followed over time), the table of loaded ones ([`Loaded`]: load, swap, claims),
//! polling (`polls`), each resource's call routing (`routing`), and the watches (directory,
//! uevents) that trigger swaps and polls. Nothing here knows kubelet: a resource that has devices is handed up as a
//! [`ReadyResource`] and the daemon serves it.

pub mod embedded;
mod follow;
mod loaded;
mod manifest;
mod polls;
mod reconcile;
mod routing;
mod settings;
mod slot;
mod source;
mod startup;
pub mod uevents;
pub mod watch;

pub use follow::{Follower, SourceStatus, Statuses};
pub use settings::{BackendSettings, Catalog, DefaultGrant};

pub use loaded::{BackendMetrics, BackendSummary, Loaded, PublishHook, Retired, StatsSnapshot, Swapped};
pub use manifest::Manifest;
pub use polls::{PollDone, PollJob, PollReport};
pub use reconcile::{Changes, Reconciler};
pub use routing::{ReadyResource, ResourceCalls};
pub use source::{BackendSource, Origin, load_dir, manifest_for, split_version};
pub use startup::{load_all, prepare_all, sources};
