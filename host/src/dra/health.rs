//! `DRAResourceHealth` (v1alpha1, KEP-4680) on a driver's DRA socket: kubelet opens
//! `NodeWatchResources` and gets the complete list of the driver's devices with their health
//! at once and again on every change of a device list, so a device a pod holds that turns
//! Unhealthy shows in the pod's status. (The scheduler learns it from the slices' taints.)

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::served::Served;
use super::slices::device_name;
use crate::model::Health;
use crate::proto::dra_health as pb;

/// The service for one driver.
#[derive(Clone)]
pub struct HealthService {
    pub served: Arc<Served>,
    pub pool: String,
    /// Bumped whenever one of the driver's device lists changes.
    pub changes: watch::Receiver<u64>,
    /// Ends every stream (the server is stopping).
    pub stop: CancellationToken,
}

impl HealthService {
    /// Every device of the driver now, with its health.
    pub fn list(&self) -> pb::NodeWatchResourcesResponse {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let devices = self
            .served
            .snapshot()
            .iter()
            .flat_map(|r| r.devices.clone())
            .map(|d| pb::DeviceHealth {
                device: Some(pb::DeviceIdentifier { pool_name: self.pool.clone(), device_name: device_name(&d.id) }),
                health: match d.health {
                    Health::Healthy => pb::HealthStatus::Healthy,
                    Health::Unhealthy => pb::HealthStatus::Unhealthy,
                } as i32,
                last_updated_time: now,
            })
            .collect();
        pb::NodeWatchResourcesResponse { devices }
    }
}

type Updates = Pin<Box<dyn futures::Stream<Item = Result<pb::NodeWatchResourcesResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl pb::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = Updates;

    async fn node_watch_resources(
        &self,
        _: tonic::Request<pb::NodeWatchResourcesRequest>,
    ) -> Result<tonic::Response<Updates>, tonic::Status> {
        let mut changes = self.changes.clone();
        changes.mark_unchanged();
        let stream = futures::stream::unfold((self.clone(), changes, true), |(svc, mut changes, first)| async move {
            if !first {
                tokio::select! {
                    _ = svc.stop.cancelled() => return None,
                    r = changes.changed() => r.ok()?,
                }
            }
            let list = svc.list();
            Some((Ok(list), (svc, changes, false)))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}
