//! One loaded backend's slot (its current instance, swapped atomically) and where the layer
//! reports calls and swaps: what the table of loaded backends, polling and call routing all
//! share, in a leaf file so none of them imports another in a circle.

use std::sync::Mutex;

use arc_swap::ArcSwap;

use super::source::Origin;
use crate::runtime::BackendInstance;

/// Where this layer reports backend calls and swaps; the daemon passes the process's metrics in
/// (none by default), so the layer does not depend on how they are exported.
pub trait BackendMetrics: Send + Sync + 'static {
    /// One call (`discover`, `allocate`, ...) of `backend` that took `took`, answered or not.
    fn backend_call(&self, backend: &str, call: &str, took: std::time::Duration);
    /// A hot swap of `backend`, taken (`ok`) or refused.
    fn swap(&self, backend: &str, ok: bool);
}

/// Metrics that go nowhere (tests, `devplug discover`).
pub(super) struct NoMetrics;

impl BackendMetrics for NoMetrics {
    fn backend_call(&self, _: &str, _: &str, _: std::time::Duration) {}
    fn swap(&self, _: &str, _: bool) {}
}

/// A loaded backend; `current` is swapped atomically, in-flight calls keep the old one alive.
pub(super) struct Slot {
    /// Where the current instance came from and its source key (content identity).
    pub(super) origin: ArcSwap<(Origin, String)>,
    pub(super) current: ArcSwap<BackendInstance>,
    pub(super) last_error: Mutex<Option<String>>,
    /// What its manifest gets wrong that loading does not refuse (requests no grant can hold).
    pub(super) warnings: ArcSwap<Vec<String>>,
}
