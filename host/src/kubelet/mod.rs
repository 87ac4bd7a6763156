//! The kubelet-facing side: one DevicePlugin gRPC server per resource on its own Unix socket,
//! registration (kubelet socket or plugin watcher), and recovery from every kind of kubelet
//! restart. It sees devices only as [`crate::model`] values behind a [`ResourceHandle`].

pub mod answer;
mod dirwatch;
mod endpoint;
mod names;
mod plumbing;
pub mod podresources;
mod registration;
mod service;
mod socket_mode;
pub mod uds;
mod watcher_mode;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

pub use crate::plugin_socket::Stage;
pub use answer::{CdiTarget, Delivery, Strategy};
pub use dirwatch::{DirEvent, DirWatcher};
pub use endpoint::{Endpoints, PATIENCE, RegistrationMode};
pub use service::DevicePluginService;

use crate::model::{Resource, ResourceOptions};

/// Where this layer reports what kubelet did and asked; the daemon passes the process's metrics
/// in, so the kubelet layer does not depend on how they are exported.
pub trait KubeletMetrics: Send + Sync + 'static {
    /// A registration kubelet accepted (`again`: not the endpoint's first).
    fn registered(&self, resource: &str, again: bool);
    /// One gRPC call kubelet made, answered with `ok` after `took`.
    fn request(&self, resource: &str, method: &str, ok: bool, took: std::time::Duration);
}

/// Everything the kubelet layer needs to serve one resource.
#[derive(Clone)]
pub struct ResourceHandle {
    pub name: String,
    pub options: ResourceOptions,
    /// The current device list (with health); every change is streamed to kubelet.
    pub devices: watch::Receiver<Arc<Resource>>,
    /// The backend's calls (the one port both APIs use; its answers have passed the node gate);
    /// their errors become gRPC statuses in the service.
    pub port: crate::model::port::Port,
    /// How Allocate answers reach the runtime (device specs, CDI).
    pub delivery: Delivery,
    /// Where request counts and latencies go (none in unit tests).
    pub metrics: Option<Arc<dyn KubeletMetrics>>,
}

/// Where kubelet lives.
#[derive(Clone, Debug)]
pub struct KubeletPaths {
    /// `/var/lib/kubelet/device-plugins`: kubelet.sock and our sockets in socket mode.
    pub device_plugin_dir: PathBuf,
    /// `/var/lib/kubelet/plugins_registry`: our sockets in plugin-watcher mode.
    pub plugins_registry_dir: PathBuf,
}
