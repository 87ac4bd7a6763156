//! `DRAResourceHealth` (KEP-4680) on a driver's DRA socket, in `v1alpha1` (kubelet 1.34-1.36)
//! and `v1` (1.37): kubelet opens `NodeWatchResources` and gets the complete list of the
//! driver's devices with their health, at once, on every change of a device list, and again
//! every [`RESEND`] in any case.
//!
//! The resend is what keeps a device from turning Unknown: kubelet stamps each report with its
//! arrival and shows a device `Unknown` once `health_check_timeout_seconds` (its default: 30 s)
//! pass without one (`pkg/kubelet/cm/dra/healthinfo.go`). devplug sets the timeout to
//! [`TIMEOUT_SECONDS`] and resends at a third of it, as the upstream Go driver resends about
//! every 2 s. An Unhealthy device carries its reason (the backend's `unhealthy` attribute) in
//! `message`, which kubelet shows in the pod's status. (The scheduler learns health from the
//! slices' taints.)

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::dra::publish::pool::pool_device_name;
use crate::dra::served::Served;
use crate::model::Health;
use crate::proto::dra_health::{v1, v1alpha1};

/// How long kubelet may keep one report before it shows the device Unknown.
pub const TIMEOUT_SECONDS: i64 = 60;
/// How often the complete list goes out again without a change: a third of the timeout, so two
/// lost or late reports still leave the device known.
pub const RESEND: Duration = Duration::from_secs(TIMEOUT_SECONDS as u64 / 3);
/// Kubelet truncates longer messages; devplug sends at most this many characters.
const MESSAGE_MAX: usize = 1024;

/// One device's health as both API versions carry it.
pub struct Report {
    pub pool: String,
    pub device: String,
    pub healthy: bool,
    pub message: String,
    pub at: i64,
}

/// The service for one driver.
#[derive(Clone)]
pub struct HealthService {
    /// The driver's resources, and its pool's identity.
    pub served: Arc<Served>,
    /// Bumped whenever one of the driver's device lists changes.
    pub changes: watch::Receiver<u64>,
    /// Ends every stream (the server is stopping).
    pub stop: CancellationToken,
}

impl HealthService {
    /// Every device of the driver now, with its health and reason (the backend's `unhealthy`
    /// attribute, or a sentence naming the backend when it gave none).
    pub fn reports(&self) -> Vec<Report> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let mut out = Vec::new();
        for r in self.served.resources() {
            let list = r.devices.borrow().clone();
            let mut named = std::collections::HashSet::new();
            for d in &list.devices {
                // Two IDs never share a pool name (`device_name` hashes), but a backend's list
                // may name one device twice: it is reported once.
                let device = pool_device_name(d);
                if !named.insert(device.clone()) {
                    continue;
                }
                let healthy = d.health == Health::Healthy;
                let message = if healthy {
                    String::new()
                } else {
                    match d.attributes.iter().find(|(k, _)| k == "unhealthy") {
                        Some((_, why)) => crate::gate::clip_to(why, MESSAGE_MAX - 40).into_owned(),
                        None => format!("backend {} reports it Unhealthy (no reason given)", r.backend),
                    }
                };
                out.push(Report { pool: self.served.id.pool().to_owned(), device, healthy, message, at: now });
            }
        }
        out
    }

    /// The stream of complete lists: one now, one on every change, one every [`RESEND`].
    fn updates<T: Send + 'static>(
        &self,
        list: fn(Vec<Report>) -> T,
    ) -> Pin<Box<dyn futures::Stream<Item = Result<T, tonic::Status>> + Send>> {
        let mut changes = self.changes.clone();
        changes.mark_unchanged();
        let svc = self.clone();
        Box::pin(futures::stream::unfold((svc, changes, true), move |(svc, mut changes, first)| async move {
            if !first {
                tokio::select! {
                    _ = svc.stop.cancelled() => return None,
                    r = changes.changed() => r.ok()?,
                    _ = tokio::time::sleep(RESEND) => {}
                }
            }
            let out = list(svc.reports());
            Some((Ok(out), (svc, changes, false)))
        }))
    }
}

/// The service in one API version: the generated types of `v1alpha1` and `v1` are distinct but
/// alike, so one macro writes both.
macro_rules! version {
    ($wrapper:ident, $m:ident) => {
        /// The health service as `$m.DRAResourceHealth`.
        #[derive(Clone)]
        pub struct $wrapper(pub HealthService);

        impl $wrapper {
            fn list(reports: Vec<Report>) -> $m::NodeWatchResourcesResponse {
                let devices = reports
                    .into_iter()
                    .map(|r| $m::DeviceHealth {
                        device: Some($m::DeviceIdentifier { pool_name: r.pool, device_name: r.device }),
                        health: if r.healthy { $m::HealthStatus::Healthy } else { $m::HealthStatus::Unhealthy } as i32,
                        last_updated_time: r.at,
                        health_check_timeout_seconds: TIMEOUT_SECONDS,
                        message: r.message,
                    })
                    .collect();
                $m::NodeWatchResourcesResponse { devices }
            }

            pub fn service(self) -> $m::dra_resource_health_server::DraResourceHealthServer<Self> {
                $m::dra_resource_health_server::DraResourceHealthServer::new(self)
                    .max_decoding_message_size(crate::plugin_socket::serve::MAX_DRA_REQUEST)
            }
        }

        #[tonic::async_trait]
        impl $m::dra_resource_health_server::DraResourceHealth for $wrapper {
            type NodeWatchResourcesStream =
                Pin<Box<dyn futures::Stream<Item = Result<$m::NodeWatchResourcesResponse, tonic::Status>> + Send>>;

            async fn node_watch_resources(
                &self,
                _: tonic::Request<$m::NodeWatchResourcesRequest>,
            ) -> Result<tonic::Response<Self::NodeWatchResourcesStream>, tonic::Status> {
                Ok(tonic::Response::new(self.0.updates(Self::list)))
            }
        }
    };
}

version!(V1alpha1, v1alpha1);
version!(V1, v1);
